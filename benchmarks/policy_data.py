"""Regenerate the tables the policy reads at run time (``scheduler/policy/data/``) from the raw data sets in
``../shared/data``, so that an installed gpupack, or a clone with nothing beside it, decides as the repository does.

    python benchmarks/policy_data.py [--shared ../shared/data] [--check]

- ``timm-benchmarks/*.csv``: timm's RTX 3090 training benchmark files (``shared/data/timm-benchmarks``), the six
  columns the time model reads, rows as published (``timemodel.load`` reads them).
- ``colocation-gavel-v100-resnet50.json``: Gavel's V100 pairs of ImageNet ResNet-50 on one GPU, each pair's summed
  normalised throughput (``shared/data/colocation-profiles/gavel/simulation_throughputs.json``, 1.2 MB, reduced to
  the pairs ``colocation.calibration`` uses).

``--check``: exit 1 when the packaged files differ from what the raw data gives (tests/test_policy_data.py runs it
where ../shared is present).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.policy.timing import colocation, timemodel  # noqa: E402

COLUMNS = ("model", "train_samples_per_sec", "train_step_time", "train_batch_size", "train_img_size", "param_count")


def derived(shared: Path) -> dict[str, str]:
    """{path under scheduler/policy/data: text} from the raw data sets."""
    out = {}
    for name in timemodel.BENCH_FILES:
        with (shared / "timm-benchmarks" / name).open() as f:
            rows = list(csv.DictReader(f))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        out[f"{timemodel.PACKAGED_BENCHMARKS}/{name}"] = buf.getvalue()
    pairs = colocation.gavel_resnet50_pairs(shared / "colocation-profiles")
    out[colocation.PACKAGED_GAVEL] = json.dumps({
        "source": "Gavel (Narayanan et al., OSDI 2020), simulation_throughputs.json, the 'v100' table: "
                  "shared/data/colocation-profiles/gavel",
        "derived": "benchmarks/policy_data.py: pairs of 'ResNet-50 (batch size N)' on one GPU; 'gain' is the two "
                   "jobs' throughputs together, each divided by its throughput alone, summed",
        "pairs": [{"batches": list(ab), "gain": gain} for ab, gain in pairs]}, indent=1) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    data = Path(colocation.__file__).resolve().parents[1] / "data"  # scheduler/policy/data
    stale = []
    for rel, text in derived(args.shared).items():
        path = data / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    if stale:
        print("stale: " + ", ".join(stale) + " (python benchmarks/policy_data.py rewrites them)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
