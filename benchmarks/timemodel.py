"""The time model's figures: its image-size exponents fitted on half of timm's same-network pairs and checked on the
other half, the cards with a measured ResNet-50 figure, and the co-location calibration. With ``--runs``, the dry
run's predicted wall and start-ups against real runs of three plans (``benchmarks/time_runs.py``).

    python benchmarks/timemodel.py [--json]
    python benchmarks/timemodel.py --runs [--cases digits,derived,inprocess] [--learn] [--json] …
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.policy.timing import colocation, timemodel as tm  # noqa: E402

ANCHORS = (("H100-80GB", "resnet50", 224, 256, 3971.0, "shared/gpu/README.md"),
           ("H100-80GB", "efficientnet_b4", 224, 192, 1735.0, "shared/gpu/README.md"),
           ("A100-80GB", "resnet50", 224, 256, 2470.0, "NVIDIA DeepLearningExamples (NOTES.md)"))


def figures() -> dict:
    out: dict = {"benchmark": str(tm.benchmark_dir()), "kinds": {}, "anchors": [], "colocation": {}}
    for kind in ("conv", "attention"):
        fit, held = tm.split(tm.same_network_pairs(kind=kind))
        alpha = tm.fit_alpha(fit)
        errors = tm.pair_errors(held, alpha)
        out["kinds"][kind] = {"alpha": alpha, "fit_pairs": len(fit), "held_out_pairs": len(held),
                              "held_out_median_abs_error": round(statistics.median(abs(e) for e in errors), 4),
                              "held_out_max_abs_error": round(max(abs(e) for e in errors), 4),
                              "held_out": [{"from": a.model, "to": b.model, "error": round(e, 4)}
                                           for (a, b), e in zip(held, errors)]}
    for card, model, size, batch, measured, source in ANCHORS:
        sp = tm.speed(model, size, batch, card=card)
        out["anchors"].append({"card": card, "model": model, "batch": batch, "modelled": sp.images_per_s,
                               "measured": measured, "error": round(sp.images_per_s / measured - 1, 4),
                               "source": source})
    for large in (True, False):
        out["colocation"]["large" if large else "other"] = [
            {"set": what, "gain": round(g, 3), "occupancy": round(o, 3)} for what, g, o in colocation.calibration(large)]
    return out


def main() -> None:
    if "--runs" in sys.argv:
        from benchmarks import time_runs

        sys.exit(time_runs.main([a for a in sys.argv[1:] if a != "--runs"]))
    f = figures()
    if "--json" in sys.argv:
        print(json.dumps(f, indent=1))
        return
    for kind, k in f["kinds"].items():
        print(f"{kind}: exponent {k['alpha']:.2f} fitted on {k['fit_pairs']} pairs; {k['held_out_pairs']} held-out "
              f"pairs: median |error| {k['held_out_median_abs_error']:.1%}, worst {k['held_out_max_abs_error']:.1%}")
    for a in f["anchors"]:
        print(f"{a['card']} {a['model']} b{a['batch']}: modelled {a['modelled']:,.0f} images/s, measured "
              f"{a['measured']:,.0f} ({a['error']:+.1%}; {a['source']})")
    for cls, rows in f["colocation"].items():
        for r in rows:
            print(f"co-location ({cls} cards): {r['set']}: gain {r['gain']}, implied occupancy {r['occupancy']}")


if __name__ == "__main__":
    main()
