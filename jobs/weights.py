"""Pretrained weights for timm jobs, through timm's own loader and the Hugging Face hub cache — never a cache of ours.

A timm job with ``pretrained: true`` loads the weights timm's ``pretrained_cfg`` names for its model (the tag, e.g.
``resnet18.a1_in1k``, kept on the hub as ``timm/resnet18.a1_in1k``, file ``model.safetensors``) from the hub cache
that ``HF_HOME`` (or ``HF_HUB_CACHE``) points at. This module is the one place that says which file a job needs
(:func:`needed`), whether it is in that cache (:func:`cached`), whether the hub could fetch it now (:func:`hub_open`),
the door's refusal (:func:`door`) and the fetch (:func:`fetch`, what ``prefetch`` runs). The job's process loads
through ``timm.create_model(..., pretrained=True)``, which reads the same cache: what the door checked is what loads.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from scheduler.core.errors import UserError

WEIGHTS_FILE = "model.safetensors"  # what timm's hub loader reads first (timm.models._hub.load_state_dict_from_hf)
PREFETCH = "python -m scheduler prefetch"
HUB_PROBE_S = 3.0  # how long the door waits to learn whether the hub answers, when the cache lacks a file


@dataclass(frozen=True)
class Need:
    """One weight file a job needs: the job, timm's tag for the weights, the hub repository and the file."""

    job: str
    model: str
    tag: str
    repo_id: str
    filename: str

    def to_json(self) -> dict:
        return {"job": self.job, "model": self.model, "tag": self.tag, "repo_id": self.repo_id,
                "file": self.filename}


def weights_of(model: str) -> tuple[str, str, str]:
    """(tag, hub repository, file) of the weights timm loads for ``model`` with ``pretrained=True``; a UserError when
    timm names none on the hub (then ``pretrained: true`` cannot be met offline)."""
    import timm

    cfg = timm.models.get_pretrained_cfg(model)
    repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not repo:
        raise UserError(f"model '{model}': timm names no Hugging Face hub weights for it (pretrained_cfg has no "
                        f"hf_hub_id); set pretrained: false, or give a local checkpoint as weights:")
    tag = repo.split("/")[-1]
    return tag, repo, getattr(cfg, "hf_hub_filename", None) or WEIGHTS_FILE


def tag_of(model: str) -> str:
    return weights_of(model)[0]


def needed(plan) -> list[Need]:
    """Every weight file the plan's ``pretrained: true`` timm jobs load, in job order."""
    out = []
    for job in plan.jobs:
        if job.kind == "timm" and getattr(job, "pretrained", False):
            tag, repo, filename = weights_of(job.model)
            out.append(Need(job.name, job.model, tag, repo, filename))
    return out


def cache_dir() -> Path:
    """The hub cache huggingface_hub reads now (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub),
    read from the environment at the call, so a test's or a user's setting applies to this process as to the job's."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached(need: Need) -> Path | None:
    """The file's path in the hub cache (the snapshot ``refs/main`` names), or None: no network is touched."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(need.repo_id, need.filename, cache_dir=str(cache_dir()))
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_open() -> tuple[bool, str]:
    """(whether the hub could fetch a file now, why not): not offline, and its endpoint accepts a connection within
    ``HUB_PROBE_S`` (a TCP connect, no request)."""
    if offline():
        return False, "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_S):
            return True, ""
    except OSError as e:
        return False, f"{host} is unreachable ({e.strerror or e})"


def door(plan, plan_path: str | None) -> list[Need]:
    """At the door (``submit``, ``--dry-run`` included, before anything runs): every ``pretrained: true`` job's
    weights are in the hub cache, or the hub is open to fetch them. Otherwise one UserError line naming the job, the
    tag and the command that fetches them (exit 2). Returns what the plan loads."""
    needs = needed(plan)
    missing = [n for n in needs if cached(n) is None]
    if missing:
        ok, why = hub_open()
        if not ok:
            n = missing[0]
            more = f" (and {len(missing) - 1} more job{'s' if len(missing) > 2 else ''})" if len(missing) > 1 else ""
            raise UserError(f"job '{n.job}': pretrained weights {n.tag} are not in the hub cache {cache_dir()}{more} "
                            f"and {why}; fetch them first: {PREFETCH} {plan_path or 'PLAN'}")
    return needs


def create_pretrained(model: str, classes: int):
    """(timm's ``model`` with its pretrained weights and a new ``classes`` head, where they came from).

    The file the door found in the hub cache is handed to timm's own loader as its ``file`` source, so what loads is
    what was checked, with no request to the hub (huggingface_hub reads ``HF_HOME`` and ``HF_HUB_OFFLINE`` once, at
    import: in a long-lived process they may be stale). Not in the cache: timm fetches it through the hub into the
    cache of :func:`cache_dir` (the door let it through only because the hub was open)."""
    import timm

    tag, repo, filename = weights_of(model)
    path = cached(Need("", model, tag, repo, filename))
    if path is not None:
        net = timm.create_model(model, pretrained=True, num_classes=classes, in_chans=3,
                                pretrained_cfg_overlay={"file": str(path)})
        return net, f"the hub cache ({path})"
    net = timm.create_model(model, pretrained=True, num_classes=classes, in_chans=3, cache_dir=str(cache_dir()))
    return net, f"the hub ({repo}, into {cache_dir()})"


def fetch(need: Need) -> Path:
    """The file, downloaded into the hub cache by huggingface_hub (with its progress bar) unless already there."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(need.repo_id, need.filename, cache_dir=str(cache_dir())))
