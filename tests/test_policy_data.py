"""What the product reads at run time ships inside the package (``scheduler/policy/data``): a clone with nothing
beside it (no ../shared) advises as the repository does, from the same figures, and ``advise`` writes no file unless
asked (``--out``)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from scheduler.policy.timing import colocation, timemodel

SHARED = ROOT.parent / "shared" / "data"
ADVISE = ["-m", "scheduler", "advise", "--hardware", "A10-24GB", "--budget", "20m", "--json"]


def test_the_policy_reads_the_packaged_tables_not_shared(monkeypatch):
    monkeypatch.delenv("GPUPACK_TIMM_BENCHMARKS", raising=False)
    monkeypatch.delenv("GPUPACK_COLOCATION_PROFILES", raising=False)
    package = Path(colocation.__file__).resolve().parents[1]  # scheduler/policy, where data/ ships
    assert timemodel.benchmark_dir().is_relative_to(package)
    assert colocation.profiles_dir() is None and colocation.gavel_resnet50_pairs()
    colocation.calibration.cache_clear()
    try:
        part = colocation.occupancy("A10-24GB")
    finally:
        colocation.calibration.cache_clear()
    assert "Gavel" in part.source and "no co-location measurements" not in part.source


@pytest.mark.skipif(not SHARED.is_dir(), reason="the raw data sets (../shared/data) are not here")
def test_the_packaged_tables_are_what_the_raw_data_gives():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import policy_data
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert policy_data.main(["--shared", str(SHARED), "--check"]) == 0, "python benchmarks/policy_data.py"
    assert colocation.gavel_resnet50_pairs() == colocation.gavel_resnet50_pairs(SHARED / "colocation-profiles")


def _advise(where: Path, cwd: Path, cache: Path, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUPACK_")}
    run = subprocess.run([sys.executable, *ADVISE], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**clean, "PYTHONPATH": str(where), "GPUPACK_CACHE_DIR": str(cache), **env})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.slow
def test_a_clone_with_nothing_beside_it_advises_as_the_repository(tmp_path):
    """The package copied alone (as ``git archive HEAD | tar -x`` leaves it, no ../shared): the same plan as the
    repository's with the raw data sets named, and no file written."""
    clone = tmp_path / "alone" / "clone"
    for part in ("scheduler", "jobs"):
        shutil.copytree(ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    assert not (clone.parent / "shared").exists()
    before = sorted(p for p in clone.rglob("*"))
    alone = _advise(clone, clone, tmp_path / "cache")
    assert sorted(p for p in clone.rglob("*") if "__pycache__" not in p.parts) == \
        [p for p in before if "__pycache__" not in p.parts]  # nothing written (no plans/advised.yaml)
    assert alone["written"] is None
    raw = {"GPUPACK_TIMM_BENCHMARKS": str(SHARED / "timm-benchmarks"),
           "GPUPACK_COLOCATION_PROFILES": str(SHARED / "colocation-profiles")} if SHARED.is_dir() else {}
    repo = _advise(ROOT, tmp_path, tmp_path / "cache", **raw)
    assert alone == repo
    assert "no co-location measurements" not in json.dumps(alone)
