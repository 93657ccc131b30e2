"""Logs bounded by bytes everywhere (``core.boundedlog``): a job printing 10 MB without a newline leaves a bounded
log (and its ``.1``), and reading it holds a bounded amount of memory."""

import logging
import tracemalloc

from scheduler.core import boundedlog
from scheduler.service.supervisor import read_log

LIMIT = 1 << 20


def test_ten_megabytes_without_a_newline_leave_a_bounded_log_and_bounded_memory(tmp_path):
    log = tmp_path / "log"
    chunk = b"x" * 65536  # as a collector brings a slot job's output home: chunks of one endless line
    for _ in range(10 * 1024 * 1024 // len(chunk)):
        boundedlog.append(log, chunk, limit=LIMIT)
    assert log.stat().st_size <= LIMIT and boundedlog.rotated(log).stat().st_size <= LIMIT
    assert not (tmp_path / "log.2").exists()
    boundedlog.append(log, b"y" * (3 * LIMIT), limit=LIMIT)  # one write past the limit keeps its last bytes
    assert log.stat().st_size <= LIMIT
    tracemalloc.start()
    text, end = read_log(log, tail=100)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(text) <= 1 << 20 and peak < 8 * LIMIT and end == log.stat().st_size


def test_a_runs_task_log_is_bounded_where_it_lands(tmp_path, monkeypatch):
    """``Runner.log``: the file a run's task writes (its lines and the job's printed output)."""
    from scheduler.runtime.runner import Runner

    monkeypatch.setattr(boundedlog, "LOG_MAX_BYTES", LIMIT)
    monkeypatch.setattr(boundedlog.append, "__defaults__", (LIMIT,))
    runner = Runner.__new__(Runner)
    runner.task_dir = lambda name: tmp_path / name
    for _ in range(40):
        runner.log("t", "z" * 100_000)  # 4 MB of lines with no newline of their own
    assert (tmp_path / "t" / "log").stat().st_size <= LIMIT
    assert (tmp_path / "t" / "log.1").stat().st_size <= LIMIT


def test_the_service_log_is_bounded(tmp_path, monkeypatch):
    from scheduler.service import servicelog

    monkeypatch.setattr(boundedlog.append, "__defaults__", (LIMIT,))
    handler = servicelog.BoundedHandler(tmp_path / "service.log")
    logger = logging.getLogger("gpupack.test.bounded")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for _ in range(30):
            logger.warning("w" * 100_000)
    finally:
        logger.removeHandler(handler)
    assert (tmp_path / "service.log").stat().st_size <= LIMIT
