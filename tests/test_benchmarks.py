"""The benchmarks are not run by the suite (they print figures and take minutes), so a restructuring could break
them unseen: here every name a benchmark takes from gpupack must exist — ``from scheduler.x import y`` and each
``module.attribute`` used on a gpupack module it imported."""

import ast
import importlib

import pytest
from conftest import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def ours(module: str) -> bool:
    return module.split(".")[0] in ("scheduler", "jobs")


def names_used(path):
    """(line, module, attribute) for every gpupack name the file uses through an import."""
    tree = ast.parse(path.read_text())
    bound = {}  # local name → gpupack module it stands for
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if ours(a.name) and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and ours(node.module) and node.level == 0:
            for a in node.names:
                out.append((node.lineno, node.module, a.name))
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            out.append((node.lineno, bound[node.value.id], node.attr))
    return out


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_gpupack_name_a_benchmark_uses_exists(path):
    for line, module, attr in names_used(path):
        try:
            target = importlib.import_module(module)
        except ModuleNotFoundError:
            parent, _, name = module.rpartition(".")
            target = getattr(importlib.import_module(parent), name)  # a class or function, not a module
            if not isinstance(target, type):
                continue  # attributes of a function's result are not checked here
        if not hasattr(target, attr):
            try:
                importlib.import_module(f"{module}.{attr}")
            except ModuleNotFoundError:
                pytest.fail(f"{path.name}:{line}: {module} has no {attr}")


def test_the_check_sees_a_missing_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from scheduler import runtime\nruntime.device_resources(None, 0.9)\n")
    assert (2, "scheduler.runtime", "device_resources") in names_used(bad)
    assert not hasattr(importlib.import_module("scheduler.runtime"), "device_resources")
