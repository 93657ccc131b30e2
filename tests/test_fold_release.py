"""A fold's model and optimizer are gone before the next fold builds its own (found on an H100, 2026-11-28).

On the card, option1's ResNet-50 task peaked at 9,521 MiB in fold 0, 9,790 in fold 1, and ran out of memory in fold 2
at the batch it had held (halved 192 → 96); EfficientNet-B4 grew 22,016 → 22,083 → 22,217. Reference cycles kept a
fold's objects after ``del fold``: the trainer's learning-rate schedule (``LambdaLR`` → its lambda → the trainer). They
were freed only when Python's cycle collector happened to run, so the old fold's weights, gradients and AdamW state sat in the allocator while the next fold built and trained,
and ``torch.cuda.empty_cache()`` could not return them.

With the collector off (as it was, in effect, between two folds on the card), the run loop itself must free the
previous fold: in a fresh process, each earlier fold's model and optimizer are dead when the next fold is built. (The
first optimizer a fresh interpreter builds is in a cycle of torch's own; the unit test below builds one first.)"""

import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from jobs.trainer import StepSettings, Trainer

ROOT = Path(__file__).resolve().parents[1]

_FOLDS = r"""
import gc, json, sys, weakref
from pathlib import Path
from jobs import JobContext, run_job, timm_job
from jobs.data import load_competition, write_digits
from jobs.timm_kind import TimmJob

timm_job.REHEARSAL_STEPS_PER_EPOCH = 2
work = Path(sys.argv[1])
comp = load_competition(write_digits(work / "digits"))
gc.collect()
gc.disable()
built, seen_alive = [], []
original = timm_job._new_fold

def new_fold(job, k, tr, va, y):
    seen_alive.append([r() is not None for r in built])  # every earlier fold's model and optimizer
    fold = original(job, k, tr, va, y)
    built.extend([weakref.ref(fold.trainer.model), weakref.ref(fold.trainer.optimizer)])
    return fold

timm_job._new_fold = new_fold
spec = TimmJob(name="tiny", kind="timm", model="resnet10t", image_size=32, batch_size=32, epochs=1, folds=3)
out = run_job(spec, comp, JobContext("tiny", work / "job", cpus=1, device="cpu", rehearsal=True))
print(json.dumps({"folds": len(out.folds), "seen_alive": seen_alive}))
"""


@pytest.mark.slow  # a timm job of two folds in a child process (25 s loaded)
def test_the_previous_folds_model_and_optimizer_are_freed_before_the_next_fold_builds(tmp_path):
    p = subprocess.run([sys.executable, "-c", _FOLDS, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["folds"] == 3
    assert got["seen_alive"] == [[], [False, False], [False, False, False, False]]


def test_a_trainer_and_its_model_are_freed_by_their_last_reference_not_by_the_cycle_collector():
    torch.optim.AdamW(torch.nn.Linear(1, 1).parameters())  # torch's own first-optimizer cycle, out of the way
    gc.collect()
    gc.disable()
    try:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        optimizer = torch.optim.AdamW(model.parameters())
        trainer = Trainer(model, optimizer, StepSettings(torch.device("cpu")), total_samples=10, batch_size=2)
        trainer.step((torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 1])))  # an optimizer step taken
        alive = [weakref.ref(o) for o in (model, optimizer, trainer)]
        del model, optimizer, trainer
        assert [r() is None for r in alive] == [True, True, True]
    finally:
        gc.enable()
