"""The kernel's sign that a process of ours was killed for host RAM.

The kernel's OOM killer ends a process with SIGKILL and writes nothing to its log: a task so ended read "exit status
-9", which says nothing a person can act on, and the run ended ``finished``, exit 0, with its folds missing. What the
kernel does leave is a count: the cgroup's ``oom_kill`` (v2 ``memory.events``, v1 ``memory.oom_control``) grows by
one per process it kills. A task that ended by SIGKILL while that count grew was killed for host RAM; its failure
reason then starts with ``runmessages.HOST_RAM_LOST``, which the run's view counts (``store.runview``).
"""

from __future__ import annotations

import signal

from scheduler.policy.running.runmessages import HOST_RAM_LOST

# read at each call, so that a test points them at files of its own
CGROUP_EVENTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
KILLED_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL)  # Popen's -9; a shell's 137


def oom_kills(paths: tuple[str, ...] | None = None) -> int | None:
    """How many processes the OOM killer has killed in this machine's (this container's) cgroup; None: not told."""
    for path in CGROUP_EVENTS if paths is None else paths:
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def kernel_killed(code: int | None, before: int | None) -> str | None:
    """The failure reason of a process that ended with ``code`` while the cgroup's OOM kills grew past ``before``
    (the count when it started), or None: it was not SIGKILLed, or nothing says the OOM killer did it."""
    if code not in KILLED_CODES or before is None:
        return None
    now = oom_kills()
    if now is None or now <= before:
        return None
    return (f"{HOST_RAM_LOST}: the kernel's OOM killer ended its process (exit status {code}; the cgroup's oom_kill "
            f"count went {before} → {now})")
