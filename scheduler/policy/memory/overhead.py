"""What a training process holds on a card beyond its tensors, per card and torch version: the overhead model.

The estimator (``policy.memory.estimate``) finds the tensors a step holds at its peak (weights, gradients, optimizer state,
saved activations). What the card then shows for the process (NVML per process, as nvidia-smi prints it) is

    nvml = (tensors + workspace) × (1 + rounding) × (1 + margin) + context + libraries

* ``workspace``: cuBLAS and cuBLASLt workspaces, which torch allocates through its caching allocator once per handle
  (8 MiB each up to Ampere/Ada, 32 MiB on Hopper and later, torch ``CUDABlas.cpp`` ``getChosenWorkspaceSize``),
  plus what cuDNN's chosen convolution algorithms hold at the peak of backward.
* ``rounding``: reserved over allocated at the peak. The caching allocator rounds every block (512 B, 2 MiB above
  1 MiB) and, without ``expandable_segments``, cannot reuse the tails of its segments; with expandable segments
  (what gpupack sets) the H100 showed reserved 50-250 MiB above allocated on 3-21 GiB of tensors (~1.2 %).
* ``context``: the CUDA context (driver state and the CUDA kernels loaded at start). With lazy module loading (CUDA
  ≥ 11.7 and torch ≥ 1.13, torch sets ``CUDA_MODULE_LOADING=LAZY``) an H100 with torch 2.11/CUDA 13 showed
  612 MiB; with eager loading (older CUDA) every kernel of libtorch_cuda is loaded at start, over 1 GiB.
* ``libraries``: the rest of NVML's figure above torch's reserved memory: cuBLAS/cuDNN handles and the kernels they
  load at first use. The H100 showed NVML 760 MiB above reserved, so 148 MiB beyond the context.
* ``margin``: what the packer is kept safe by. Estimates are meant to land in the upper half of −5 … +10 % of the
  card's figure, never under it: the tensor model is within ±2 % of the H100's allocations, a step's figure moves by
  a few per cent with cuDNN's algorithm choice, and a job reads its peak after a few steps, not over the whole run.

Each (card, torch) pair resolves to one :class:`Overhead`, whose ``basis`` says where its figures come from.
The RTX 3090 figures (torch 1.11/1.12 with CUDA 11.3, eager loading, no expandable segments) are the ones timm's
benchmark runs used; they were fitted on the ``fit`` half of those rows (``benchmarks/estimator.py``).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

SOURCE_H100 = ("measured on an H100 80GB HBM3, 2026-11-22 (torch 2.11.0+cu130, expandable segments): context "
               "612 MiB, NVML 760 MiB above reserved, reserved 50-250 MiB above allocated")
SOURCE_3090 = ("fitted on the fit half of timm's RTX 3090 training benchmark (torch 1.11/1.12, CUDA 11.3: eager "
               "module loading, no expandable segments; benchmarks/estimator.py)")

MARGIN = 0.03  # the packer's safety margin on the allocator's part

# the card's architecture, by hardware profile name (a profile or an NVML name); cuBLAS workspaces follow it
_ARCH = (("H200", "sm90"), ("H100", "sm90"), ("B200", "sm100"), ("A100", "sm80"), ("A10", "sm86"), ("A40", "sm86"),
         ("3090", "sm86"), ("4090", "sm89"), ("L40", "sm89"), ("L4", "sm89"), ("V100", "sm70"), ("T4", "sm75"))


@dataclass(frozen=True)
class Overhead:
    card: str  # the card it was resolved for ("" when unknown)
    torch: str  # the torch version it was resolved for
    context_mib: float
    libraries_mib: float
    workspace_mib: float
    rounding: float  # reserved ÷ allocated − 1 at the peak
    margin: float
    basis: str

    def allocator_mib(self, tensors_mib: float) -> float:
        """What the allocator reserves at the peak for ``tensors_mib`` of tensors, with the safety margin."""
        return (tensors_mib + self.workspace_mib) * (1 + self.rounding) * (1 + self.margin)

    def nvml_mib(self, tensors_mib: float) -> float:
        """What NVML shows for the process at the peak."""
        return self.allocator_mib(tensors_mib) + self.context_mib + self.libraries_mib

    def to_json(self) -> dict:
        return asdict(self)


def architecture(card: str | None) -> str | None:
    name = (card or "").upper()
    return next((arch for key, arch in _ARCH if key in name), None)


def torch_cuda(torch_version: str | None) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """((major, minor) of torch, (major, minor) of CUDA or None) from a version such as ``2.11.0+cu130``."""
    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    tv = (int(m.group(1)), int(m.group(2))) if m else (2, 0)
    c = re.search(r"cu(\d+)", torch_version or "")
    cuda = None
    if c:
        digits = c.group(1)
        cuda = (int(digits[:-1]), int(digits[-1]))  # cu113 → 11.3, cu130 → 13.0, cu121 → 12.1
    return tv, cuda


def lazy_loading(torch_version: str | None) -> bool:
    tv, cuda = torch_cuda(torch_version)
    return tv >= (1, 13) and (cuda is None or cuda >= (11, 7))


def expandable_segments(torch_version: str | None) -> bool:
    """gpupack sets ``expandable_segments:True``; torch has it from 2.1."""
    return torch_cuda(torch_version)[0] >= (2, 1)


def cublas_workspace_mib(card: str | None, torch_version: str | None) -> float:
    """cuBLAS + cuBLASLt workspaces: 32 MiB each on Hopper and later with torch ≥ 2.3, else ~8 MiB each
    (``:4096:2:16:8`` = 8.1 MiB); cuBLASLt had 1 MiB before torch 2.5."""
    tv, _ = torch_cuda(torch_version)
    arch = architecture(card)
    hopper = arch in ("sm90", "sm100") and tv >= (2, 3)
    cublas = 32.0 if hopper else 8.125
    lt = cublas if tv >= (2, 5) else 1.0
    return cublas + lt


# what the H100 showed (lazy loading, expandable segments); assumed for other cards of that software until measured
LAZY_CONTEXT_MIB = 612.0
LAZY_LIBRARIES_MIB = 148.0
EXPANDABLE_ROUNDING = 0.012
# eager loading and the classic allocator (timm's RTX 3090 runs): fitted, see SOURCE_3090
EAGER_CONTEXT_MIB = 1100.0
EAGER_LIBRARIES_MIB = 150.0
CLASSIC_ROUNDING = 0.015
CUDNN_WORKSPACE_MIB = 0.0  # cuDNN's workspaces at the peak: none seen beyond the other terms on the H100


def this_torch() -> str:
    """This process's torch version, with its CUDA (``2.11.0+cu130``); read from the installed package's metadata,
    without importing torch, when nothing here has imported it yet (seconds a command job or the service need not
    spend: the version says the same of module loading)."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            return version("torch")
        except PackageNotFoundError:  # pragma: no cover - torch is a dependency
            return "2.0"
    torch_version = str(torch.__version__)
    if getattr(torch.version, "cuda", None) and "+cu" not in torch_version:
        torch_version += "+cu" + torch.version.cuda.replace(".", "")
    return torch_version


def overhead_for(card: str | None = None, torch_version: str | None = None) -> Overhead:
    """The overhead model for a card (hardware profile or NVML name; None: unknown) and a torch version (None:
    this process's)."""
    if torch_version is None:
        torch_version = this_torch()
    lazy, expandable = lazy_loading(torch_version), expandable_segments(torch_version)
    basis = []
    if lazy:
        context, libraries = LAZY_CONTEXT_MIB, LAZY_LIBRARIES_MIB
        basis.append("context and libraries as measured on an H100 with lazy loading" +
                     ("" if architecture(card) == "sm90" else " (assumed for this card)"))
    else:
        context, libraries = EAGER_CONTEXT_MIB, EAGER_LIBRARIES_MIB
        basis.append("context and libraries with eager module loading, fitted on timm's RTX 3090 rows")
    rounding = EXPANDABLE_ROUNDING if expandable else CLASSIC_ROUNDING
    basis.append("allocator rounding " + ("with expandable segments, as measured on an H100" if expandable else
                                          "of the classic allocator, fitted on timm's RTX 3090 rows"))
    workspace = cublas_workspace_mib(card, torch_version) + CUDNN_WORKSPACE_MIB
    basis.append(f"cuBLAS/cuBLASLt workspaces {workspace:.0f} MiB for {architecture(card) or 'an unknown card'}")
    return Overhead(card=card or "", torch=torch_version, context_mib=context, libraries_mib=libraries,
                    workspace_mib=workspace, rounding=rounding, margin=MARGIN, basis="; ".join(basis))


def outside_allocator_mib(card: str | None = None, torch_version: str | None = None) -> float:
    """What a process holds on the card outside PyTorch's allocator: the CUDA context and the libraries' handles and
    kernels (612 + 148 = 760 MiB NVML showed on an H100 with torch 2.11 and lazy loading; over 1 GiB with eager
    loading). A job's planned MiB counts them (the estimator adds them), so its cap (``core.memcap``) leaves them
    outside the allocator, and NVML's figure for the process stays inside the plan."""
    o = overhead_for(card, torch_version)
    return o.context_mib + o.libraries_mib


def error(estimated: float, measured: float) -> float:
    """(estimated − measured) ÷ measured."""
    return (estimated - measured) / measured if measured else math.inf
