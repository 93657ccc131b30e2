"""OpenMP's threads wait for work passively (``OMP_WAIT_POLICY=PASSIVE``) in every process gpupack runs a job in or
hands to a job: the driver (the door's rounds probe, an in-process run), a job's own process, a command's script and
a service slot's environment. A person's own setting of the variable wins.

Why: LightGBM and XGBoost thread each boosting round with OpenMP (libgomp), whose threads spin at the round's
barriers by default. Where the cores are shared — a 2-core machine whose other work keeps them busy, the CPU
rehearsal beside other jobs, a laptop — a spinning thread holds the core the thread it waits for needs, and a round
takes tens of times longer: LightGBM, 100 rounds on diamonds' 40,000 rows with 2 threads on 2 cores under a load of
5.5, took 0.514 s a round spinning against 0.0079 s waiting passively (and 0.006 s on one thread); the time model and
the budget then saw a fold 7x slower than predicted and cut every job to one fold of 50 rounds
(``benchmarks/openmp_wait.py`` measures both policies in one sitting, each in its own process).

libgomp reads the variable once, when it is loaded: it is set before a job's process imports its library
(``scheduler.execute.apply``), as the CLI starts (``scheduler.cli.main``, before any library is imported and before
a local Ray starts, whose workers inherit it), and in the environments gpupack builds for a script or a slot.
"""

from __future__ import annotations

import os
from typing import MutableMapping

VARIABLE, POLICY = "OMP_WAIT_POLICY", "PASSIVE"


def wait_passively(environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (this process's by default) unless it is set already."""
    (os.environ if environ is None else environ).setdefault(VARIABLE, POLICY)


def env() -> dict[str, str]:
    """The variable for an environment gpupack builds for another process (a script, a slot): this process's own
    setting where it has one, else passive."""
    return {VARIABLE: os.environ.get(VARIABLE, POLICY)}
