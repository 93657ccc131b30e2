"""Where gpupack keeps what it learns between runs: ``$GPUPACK_CACHE_DIR``, else ``~/.cache/gpupack``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("GPUPACK_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "gpupack"
