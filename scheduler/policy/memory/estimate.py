"""Peak GPU memory of one training step of a timm image classifier, found on a CPU without a GPU.

Why this works: what a training step holds at its peak is (a) the fp32 weights, gradients and optimizer state, which
follow from the parameter count, and (b) the activations autograd saves for backward, which are linear in the batch.
(b) is measured: the model is built on ``meta`` and materialised as fake tensors (``FakeTensorMode``: shapes, dtypes
and storages, no data, nothing computed), then run forward at two batch sizes under CPU autocast (bf16, the same
width as CUDA fp16). ``saved_tensors_hooks`` sees every tensor autograd keeps; the unique non-parameter storages
are summed and fitted as ``fixed + per_sample · batch``. Fake tensors give the same bytes as a real CPU forward (the
test suite checks this) in a fraction of the time; a model that fake tensors cannot run (data-dependent shapes)
falls back to a real CPU forward.

CPU autocast is not CUDA autocast: CUDA runs softmax, layer_norm, group_norm, exp, pow, sum … in fp32 and CPU does
not. ``_CudaAutocastFp32`` upcasts those ops' inputs, so the saved tensors are the ones CUDA would keep (non-fused
ViT-B b256: 24.5 GiB this way against 24.4 measured on CUDA, 19.2 without it). Fused SDPA, which timm uses when
``timm.layers.use_fused_attn()`` is on, saves the same on both; that flag is part of the cache key.

What is not in the tensors (the CUDA context, the libraries' handles and kernels, cuBLAS/cuDNN workspaces, the
caching allocator's rounding, and the packer's safety margin) is ``policy.memory.overhead``'s model, per card and torch
version, with its sources; ``Estimate.peak_mib`` is what NVML would show for the process at the step's peak.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.policy.memory.overhead import overhead_for

MIB = 1024 * 1024
LADDER = (512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2, 1)

# fp32 optimizer state per parameter, in copies of the parameter.
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "lamb": 2, "nadam": 2, "radam": 2, "sgd": 1, "momentum": 1,
                    "rmsprop": 1, "adagrad": 1, "sgd_nomomentum": 0}

# Ops that CUDA autocast runs in fp32 (torch autocast docs, "CUDA Ops that can autocast to float32") and CPU
# autocast does not. Matched by the name of the Python function or Tensor method.
_CUDA_FP32_OPS = frozenset({
    "softmax", "log_softmax", "softmin", "layer_norm", "group_norm", "rms_norm", "normalize", "softplus",
    "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "pow", "__pow__", "__rpow__",
    "__rdiv__", "__rtruediv__", "sum", "prod", "cumsum", "cumprod", "norm", "logsumexp", "cosine_similarity",
    "cdist", "dist", "pdist", "renorm", "acos", "asin", "cosh", "sinh", "tan", "erfinv",
})

_memo: dict[str, dict] = {}


@dataclass(frozen=True)
class Estimate:
    model: str
    image_size: int
    batch_size: int
    amp: bool
    optimizer: str
    channels_last: bool
    params: int
    weights_mib: float
    gradients_mib: float
    optimizer_mib: float
    activations_mib: float
    activations_per_sample_mib: float
    workspace_mib: float  # the allocator's part beyond the tensors: workspaces, rounding, the safety margin
    cuda_context_mib: float  # outside the allocator: the CUDA context and the libraries' handles and kernels
    peak_mib: int
    seconds: float
    cached: bool
    card: str = ""  # the card whose overhead was used ("" when unknown)
    overhead: dict | None = None  # policy.memory.overhead.Overhead of that card and torch version, with its basis

    def to_json(self) -> dict:
        return asdict(self)


def estimate(model: str, image_size: int, batch_size: int, *, amp: bool = True, optimizer: str = "adamw",
             channels_last: bool = True, num_classes: int = 1000, cache_dir: Path | None = None,
             card: str | None = None, torch_version: str | None = None) -> Estimate:
    """The peak memory of one training step of timm ``model`` (CUDA, one GPU) as the card shows it for the process;
    the activations are measured once per configuration and cached on disk, so every other batch size is answered
    at once. ``card`` (a hardware profile) and ``torch_version`` (default: this one) choose the overhead model."""
    _check_positive(image_size=image_size, batch_size=batch_size, num_classes=num_classes)
    optimizer = optimizer.lower()
    if optimizer not in OPTIMIZER_STATES:
        raise UserError(f"unknown optimizer '{optimizer}'; allowed: {', '.join(sorted(OPTIMIZER_STATES))}")
    _check_model(model)
    m = measurement(model, image_size, amp=amp, optimizer=optimizer, channels_last=channels_last,
                    num_classes=num_classes, cache_dir=cache_dir)
    weights = m["weight_bytes"] / MIB
    grads = m["params"] * 4 / MIB
    opt = OPTIMIZER_STATES[optimizer] * grads
    per_sample = m["per_sample_bytes"] / MIB
    activations = max(0.0, m["fixed_bytes"] / MIB + per_sample * batch_size)
    over = overhead_for(card, torch_version)
    tensors = weights + grads + opt + activations
    workspace = over.allocator_mib(tensors) - tensors
    context = over.context_mib + over.libraries_mib
    total = tensors + workspace + context
    return Estimate(model=model, image_size=image_size, batch_size=batch_size, amp=amp, optimizer=optimizer,
                    channels_last=channels_last, params=m["params"], weights_mib=weights, gradients_mib=grads,
                    optimizer_mib=opt, activations_mib=activations, activations_per_sample_mib=per_sample,
                    workspace_mib=workspace, cuda_context_mib=context, peak_mib=math.ceil(total),
                    seconds=0.0 if m["cached"] else m["seconds"], cached=m["cached"], card=card or "",
                    overhead=over.to_json())


@dataclass(frozen=True)
class SimulatedPeak:
    """A job's peak MiB at a batch by the estimator, times ``scale`` (its packed MiB over the computed ones when a
    real card's measurement packed it): the memory model of a CPU rehearsal's simulated device. The job's process
    hands it to the job (``execute.apply``), so ``jobs/`` imports no estimator; a frozen value, so it pickles."""

    model: str
    image_size: int
    amp: bool
    optimizer: str
    channels_last: bool
    scale: float = 1.0

    def __call__(self, batch: int) -> float:
        return estimate(self.model, self.image_size, batch, amp=self.amp, optimizer=self.optimizer,
                        channels_last=self.channels_last).peak_mib * self.scale


def simulated_peak(spec, scale: float = 1.0) -> SimulatedPeak:
    """The simulated device's memory model for a timm ``spec`` (at the plan's image size, not the rehearsal's)."""
    w = kinds.work(spec)
    return SimulatedPeak(w.model, w.image_size, w.amp, w.optimizer, w.channels_last, scale or 1.0)


# (model, image_size, batch_size, *, amp, optimizer, channels_last, card) -> (MiB, source) or None: a measured figure
# from a real card (``store.measurements.memory_source``), handed in by the layer that reads the cache.
MeasuredFn = Callable[..., "tuple[float, str] | None"]


@dataclass(frozen=True)
class Figure:
    """The memory a job is packed with: a measured figure when a real card measured this configuration (or two or
    more batches of it), else the computed one; ``source`` says which."""

    mib: int
    source: str  # "computed", "measured" or "measured, scaled from batches 64, 256"
    computed_mib: int
    measured_mib: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


def figure(model: str, image_size: int, batch_size: int, *, amp: bool = True, optimizer: str = "adamw",
           channels_last: bool = True, card: str | None = None, measured: MeasuredFn | None = None,
           cache_dir: Path | None = None) -> Figure:
    """The figure to pack ``model`` at ``batch_size`` with: measured before computed."""
    computed = estimate(model, image_size, batch_size, amp=amp, optimizer=optimizer, channels_last=channels_last,
                        cache_dir=cache_dir, card=card).peak_mib
    got = None if measured is None else measured(model, image_size, batch_size, amp=amp, optimizer=optimizer.lower(),
                                                  channels_last=channels_last, card=card or "")
    if not got:
        return Figure(computed, "computed", computed)
    mib, source = got
    return Figure(math.ceil(mib), source, computed, math.ceil(mib))


OVER_ESTIMATE = 0.05  # a real peak this far over its estimate draws a warning, and the measured figure is used


def over_estimate(estimated_mib: float | None, measured_mib: float | None) -> float | None:
    """How far ``measured_mib`` passed ``estimated_mib`` (0.08 = 8 % over) when it is more than ``OVER_ESTIMATE``;
    None otherwise, or when either is unknown."""
    if not estimated_mib or not measured_mib or estimated_mib <= 0:
        return None
    over = measured_mib / estimated_mib - 1
    return over if over > OVER_ESTIMATE else None


def largest_batch(model, image_size, limit_mib, amp=True, optimizer="adamw", ladder=LADDER, **kw) -> int | None:
    """The largest batch on ``ladder`` whose peak fits in ``limit_mib``, or None if not even the smallest does.
    One measurement serves every rung: activations are linear in the batch."""
    fits = [b for b in ladder if estimate(model, image_size, b, amp=amp, optimizer=optimizer, **kw).peak_mib
            <= limit_mib]
    return max(fits, default=None)


def measurement(model: str, image_size: int, *, amp: bool, optimizer: str, channels_last: bool, num_classes: int,
                cache_dir: Path | None = None) -> dict:
    """The cached parts of an estimate: parameter count, weight bytes, and the saved activations' fixed and
    per-sample bytes. Adds ``cached`` and ``seconds``."""
    import timm
    import torch

    key_fields = {"model": model, "image_size": image_size, "amp": bool(amp), "optimizer": optimizer,
                  "channels_last": bool(channels_last), "num_classes": num_classes,
                  "fused_attn": bool(timm.layers.use_fused_attn()), "torch": torch.__version__,
                  "timm": timm.__version__, "method": 1}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:24]
    if key in _memo:
        return {**_memo[key], "cached": True}
    path = _cache_path(cache_dir, model, key)
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key_fields:
                _memo[key] = data
                return {**data, "cached": True}
        except (OSError, ValueError):
            pass
    start = time.perf_counter()
    data = {"key": key_fields, **_measure(model, image_size, amp, channels_last, num_classes)}
    data["seconds"] = time.perf_counter() - start
    _memo[key] = data
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache costs time, not correctness
    return {**data, "cached": False}


def default_cache_dir() -> Path:
    env = os.environ.get("GPUPACK_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gpupack" / "estimates"


def _cache_path(cache_dir: Path | None, model: str, key: str) -> Path | None:
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)
    return base / f"{safe}-{key}.json"


def _check_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"{name} must be a positive integer, got {value!r}")


def _check_model(model: str) -> None:
    import timm

    if isinstance(model, str) and model and timm.is_model(model):
        return
    close = difflib.get_close_matches(str(model), timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    raise UserError(f"timm {timm.__version__} has no model '{model}'{hint}")


def _measure(model: str, image_size: int, amp: bool, channels_last: bool, num_classes: int) -> dict:
    """Saved-activation bytes at two batch sizes, fitted linearly. Fake tensors first, a real CPU forward if the
    model does something fake tensors cannot (data-dependent shapes). Batches 2 and 4 if batch 1 is refused
    (BatchNorm after pooling needs more than one value per channel)."""
    errors = []
    for fake in (True, False):
        for batches in ((1, 2), (2, 4)):
            try:
                params, weight_bytes, sizes = _saved_bytes(model, image_size, batches, amp=amp,
                                                           channels_last=channels_last,
                                                           num_classes=num_classes, fake=fake)
            except Exception as exc:  # noqa: BLE001 -- try the next way, report all if none works
                errors.append(f"{'fake' if fake else 'real'} {batches}: {type(exc).__name__}: {exc}"[:300])
                continue
            (b1, s1), (b2, s2) = zip(batches, sizes)
            per_sample = (s2 - s1) / (b2 - b1)
            return {"params": params, "weight_bytes": weight_bytes, "per_sample_bytes": per_sample,
                    "fixed_bytes": s1 - per_sample * b1, "fake": fake, "batches": list(batches)}
    raise RuntimeError(f"could not run a forward of '{model}' at {image_size}px:\n  " + "\n  ".join(errors))


def _saved_bytes(model, image_size, batches, *, amp=True, channels_last=True, num_classes=1000, fake=False):
    import timm
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = _build(timm, torch, model, image_size, num_classes, meta=fake)
    net.train()
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    if fake:
        with mode:
            net = net.to_empty(device="cpu")
    params = sum(p.numel() for p in net.parameters())
    weight_bytes = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
    param_storages = {p.untyped_storage()._cdata for p in net.parameters()}
    sizes = []
    for batch in batches:
        seen: dict[int, int] = {}

        def pack(t):
            s = t.untyped_storage()
            if s._cdata not in param_storages:
                seen.setdefault(s._cdata, s.nbytes())
            return t

        with (mode if fake else _nullcontext()):
            x = torch.randn(batch, 3, image_size, image_size)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, num_classes, (batch,))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                    torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp), \
                    (_CudaAutocastFp32() if amp else _nullcontext()):
                out = net(x)
                if isinstance(out, (tuple, list)):  # distillation heads return two logits in training
                    out = out[0]
                F.cross_entropy(out.float(), y)
        # the fp32 input batch lives on the GPU too, though autograd saves its fp16 cast
        sizes.append(sum(seen.values()) + x.numel() * x.element_size())
    return params, weight_bytes, sizes


def _build(timm, torch, model, image_size, num_classes, meta):
    """timm's model; ViT-style models fix their input size at construction, so pass it if it differs."""

    def create(**extra):
        if meta:
            with torch.device("meta"):
                return timm.create_model(model, pretrained=False, num_classes=num_classes, **extra)
        return timm.create_model(model, pretrained=False, num_classes=num_classes, **extra)

    net = create()
    default = (getattr(net, "pretrained_cfg", None) or {}).get("input_size", (3, image_size, image_size))
    if hasattr(net, "patch_embed") and tuple(default[-2:]) != (image_size, image_size):
        try:
            net = create(img_size=image_size)
        except TypeError:
            pass
    return net


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _cuda_fp32_mode():
    from torch.overrides import TorchFunctionMode
    import torch

    low = (torch.float16, torch.bfloat16)

    def up(a):
        if isinstance(a, torch.Tensor) and a.dtype in low:
            return a.float()
        if isinstance(a, (list, tuple)):
            return type(a)(up(v) for v in a)
        return a

    class CudaAutocastFp32(TorchFunctionMode):
        """Make CPU autocast keep what CUDA autocast keeps: inputs of CUDA's fp32 ops are upcast first."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", None) in _CUDA_FP32_OPS and torch.is_autocast_enabled("cpu"):
                args, kwargs = up(args), {k: up(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return CudaAutocastFp32


def _CudaAutocastFp32():
    return _cuda_fp32_mode()()
