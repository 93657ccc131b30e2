"""The model a timm job trains: from scratch, from timm's pretrained weights (``pretrained: true``: through timm's own
loader, read from the Hugging Face hub cache the door checked, ``jobs.weights``), or from a local checkpoint; always
with a zero classifier head for the competition's classes."""

from __future__ import annotations

from pathlib import Path

import torch


def new_model(name: str, classes: int, weights: str | None, notes: list[str],
              pretrained: bool = False) -> torch.nn.Module:
    """timm's ``name`` with ``classes`` outputs on three channels; with ``pretrained``, timm's weights for it (its tag
    said in ``notes``; timm drops the 1000-class head); ``weights``, a local file, loaded where names and shapes match
    (what was loaded is said in ``notes``)."""
    import timm

    if pretrained:
        from jobs import weights as hub

        model, where = hub.create_pretrained(name, classes)
        notes.append(f"pretrained weights {hub.tag_of(name)} loaded through timm from {where}")
    else:
        model = timm.create_model(name, pretrained=False, num_classes=classes, in_chans=3)
    _zero_head(model)
    if weights:
        _load_weights(model, weights, notes)
    return model


def _zero_head(model: torch.nn.Module) -> None:
    """Start the new classifier at zero: uniform initial predictions, loss log(k).

    timm's EfficientNet head init gives logits with a std near 8 from scratch; with a zero head its 75-step rehearsal
    reaches about 0.7 accuracy on digits instead of about 0.35. A head loaded from ``weights`` replaces this.
    """
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    if isinstance(head, torch.nn.Linear):
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.zeros_(head.bias)


def _load_weights(model: torch.nn.Module, path: str, notes: list[str]) -> None:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"weights: {p} is not a file (gpupack loads local checkpoints only; nothing is downloaded)")
    state = torch.load(p, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}
    own = model.state_dict()
    kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(kept, strict=False)
    notes.append(f"weights {p.name}: {len(kept)} of {len(own)} tensors loaded "
                 f"({len(state) - len(kept)} skipped: other names or shapes, e.g. the classifier)")
