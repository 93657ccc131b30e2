"""``python -m scheduler`` with the run's blend held until a stop arrives: for the signal tests alone.

The plan's blend (``scheduler.policy.ensemble.blend``, its first call) writes the file named by
``GPUPACK_TEST_BLEND_MARK`` when it begins, then waits (at most ``GPUPACK_TEST_BLEND_HOLD_S``, 60 s) before blending:
a signal sent when the run says its blend began (its ``blend_start`` event; this mark where the code has no such
event) lands inside the blend, however quick the blend is. Later calls (a fallback blend) run as they are, and so does
a first call made after a stop arrived (the stop landed before the plan's blend began, and the fallback blend that
follows has no stop left to wait for: it waited the whole minute, which was most of each test's 65-77 s)."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tree it lives in, as `python -m` from its root

import scheduler.policy.ensemble as ensemble  # noqa: E402
import scheduler.runtime.submit as submit  # noqa: E402

_blend, _held, _stops = ensemble.blend, [], []
_handle = submit.Stops._handle


def _noted(self, signum, frame):
    """The driver's stop handler (``submit.Stops``), each stop noted here first."""
    _stops.append(signum)
    return _handle(self, signum, frame)


submit.Stops._handle = _noted


def blend(*args, **kwargs):
    if not _held and not _stops:
        _held.append(time.time())
        Path(os.environ["GPUPACK_TEST_BLEND_MARK"]).write_text(str(os.getpid()))
        end = time.time() + float(os.environ.get("GPUPACK_TEST_BLEND_HOLD_S", "60"))
        while time.time() < end:  # a stop's handler raises here, inside the blend
            time.sleep(0.01)
    return _blend(*args, **kwargs)


ensemble.blend = blend

from scheduler.cli.main import main  # noqa: E402  (after the blend is held)

raise SystemExit(main(sys.argv[1:]))
