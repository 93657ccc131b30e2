"""A job kind is written once, in its descriptor (``scheduler.core.kinds``): nothing outside ``jobs/`` compares a
kind's name, and a kind registered from outside is validated, planned and packed with no change to ``scheduler/``."""

import re
from typing import Literal

import pytest

from conftest import ROOT, TEST_HARDWARE
from scheduler.core import kinds
from scheduler.core.errors import UserError
from scheduler.core.plan import JobBase, from_dict
from scheduler.policy.planning import dryrun

NAME_TEST = re.compile(r"kind (==|!=|in) .*(timm|lightgbm|command|xgboost)")


def test_nothing_outside_jobs_compares_a_kinds_name():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "scheduler").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if NAME_TEST.search(line)]
    assert hits == []


class ToyJob(JobBase):
    kind: Literal["toy"]
    depth: int = 3


def test_a_kind_registered_from_outside_is_validated_planned_and_packed(monkeypatch):
    toy = kinds.Kind(name="toy", spec=ToyJob, gpu="none", reads="anything", runs_in="python", time_model="trees",
                     imports_s=0.5, host_mib=lambda job, **facts: 321)
    monkeypatch.setitem(kinds._REGISTRY, "toy", toy)
    plan = from_dict({"name": "p", "hardware": TEST_HARDWARE, "jobs": [
        {"name": "t", "kind": "toy", "folds": 2, "depth": 5, "resources": {"cpus": 1}}]})
    assert type(plan.jobs[0]) is ToyJob and plan.jobs[0].depth == 5
    assert plan.model_dump()["jobs"][0]["depth"] == 5  # dumped as its own kind, not the base
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    [a] = dry.placement.assignments
    assert a.gpu_memory_mib == 0 and a.host_memory_mib == 321  # its descriptor's figures, not a guess by name
    with pytest.raises(UserError, match=r"jobs\[0\] \(t\).depth"):
        from_dict({"name": "p", "jobs": [{"name": "t", "kind": "toy", "depth": "deep"}]})


def test_an_unknown_kind_names_the_registered_ones():
    with pytest.raises(UserError, match=r"unknown kind 'lightgmb' \(did you mean lightgbm\?\); allowed: timm, light"):
        from_dict({"name": "p", "jobs": [{"name": "x", "kind": "lightgmb"}]})
    assert set(kinds.names()) >= {"timm", "lightgbm", "command"}
    with pytest.raises(UserError, match="unknown job kind 'nope'"):
        kinds.get("nope")
