import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def run_cli(capsys):
    """Run ``python -m scheduler ARGS`` in-process; returns (exit status, stdout, stderr)."""
    from scheduler.cli import main

    def run(*args: str):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run
