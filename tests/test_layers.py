"""The folders are the architecture: each layer imports only the layers below it, parsed from the source.

    core  <-  policy  <-  jobs  <-  store  <-  execute  <-  runtime  <-  service, cli

``core`` (plan, units, errors, hardware, scoring) imports nothing of gpupack's above it; ``policy`` (pure decisions)
never touches Ray, a run folder or a job; ``jobs`` (the job kinds) use only core and policy; ``store`` (the run
folder) never starts anything; ``execute`` (the launch record, the executor and its backends) runs one job and
knows no run loop; ``runtime`` (Ray) never serves; nothing but ``scheduler.__main__`` imports the CLI.
"""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

ALLOWED = {
    "core": {"core"},
    "policy": {"core", "policy"},
    "jobs": {"core", "policy", "jobs"},
    "store": {"core", "policy", "jobs", "store"},
    "execute": {"core", "policy", "jobs", "store", "execute"},
    "runtime": {"core", "policy", "jobs", "store", "execute", "runtime"},
    "service": {"core", "policy", "jobs", "store", "execute", "runtime", "service"},
    "cli": {"core", "policy", "jobs", "store", "execute", "runtime", "service", "cli"},
}
LAYERS = ("core", "policy", "runtime", "store", "execute", "service", "cli")


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "jobs":
        return "jobs"
    if parts[0] == "scheduler" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return None


def modules() -> list[Path]:
    return sorted(list((ROOT / "scheduler").rglob("*.py")) + list((ROOT / "jobs").rglob("*.py")))


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "<relative import>"))
    return out


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_scheduler_module_lives_in_a_layer():
    loose = [module_name(p) for p in (ROOT / "scheduler").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert loose == [], f"modules outside the layer folders: {loose}"


def test_no_import_points_up_the_layers():
    wrong = []
    for path in modules():
        src = layer_of(module_name(path))
        if src is None:
            continue
        for line, target in imports(path):
            assert target != "<relative import>", f"{path}:{line}: a relative import (write the layer's name)"
            dst = layer_of(target)
            if dst is not None and dst not in ALLOWED[src]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {src} imports {target} ({dst})")
    assert wrong == [], "\n".join(wrong)


def test_the_check_itself_sees_an_upward_import(tmp_path):
    """A test that cannot fail proves nothing: the same walk flags a policy module that imports the runtime."""
    bad = tmp_path / "bad.py"
    bad.write_text("import ray\nfrom scheduler.runtime.cluster import start\n")
    found = [t for _, t in imports(bad) if layer_of(t) and layer_of(t) not in ALLOWED["policy"]]
    assert found == ["scheduler.runtime.cluster", "scheduler.runtime.cluster.start"]


@pytest.mark.parametrize("layer", ["core", "policy"])
def test_core_and_policy_never_touch_ray(layer):
    users = [module_name(p) for p in (ROOT / "scheduler" / layer).rglob("*.py")
             if any(t == "ray" or t.startswith("ray.") for _, t in imports(p))]
    assert users == []


MAX_POSITIONAL = 6


def test_calls_stay_readable():
    """No function takes more than six positional parameters (the rest, if any, are keyword-only options with
    defaults, or a small object such as ``advice.Observed`` or ``ledger.Learned``). A module's length is not capped:
    a module holds one idea, however long that is."""
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = [x.arg for x in a.posonlyargs + a.args if x.arg not in ("self", "cls")]
                assert len(positional) <= MAX_POSITIONAL, f"{module_name(path)}.{node.name}: {len(positional)}"
                kw_without_default = [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
                assert not kw_without_default or len(positional) + len(kw_without_default) <= MAX_POSITIONAL, \
                    f"{module_name(path)}.{node.name}: required {positional + kw_without_default}"


PROCESS_CALLS = {"Popen", "run", "call", "check_call", "check_output", "killpg", "kill", "fork", "spawnv", "system",
                 "execv", "execvp"}
PROCESS_MODULES = {"subprocess", "os", "signal", "multiprocessing"}


def process_uses(path: Path) -> list[str]:
    """Where a module starts or signals a process itself: ``subprocess`` imported, or a call of ``Popen``,
    ``subprocess.run``, ``os.killpg``/``os.kill``/``os.fork``/``os.system``/``os.exec…``, ``signal.…``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            word = "import" if isinstance(node, ast.Import) else "from"
            found += [f"{node.lineno}: {word} {n}" for n in names
                      if n.split(".")[0] in ("subprocess", "signal", "multiprocessing")]
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                found += [f"{node.lineno}: from os import {a.name}" for a in node.names if a.name in PROCESS_CALLS]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "Popen":
                found.append(f"{node.lineno}: Popen(")
            elif (isinstance(f, ast.Attribute) and f.attr in PROCESS_CALLS and isinstance(f.value, ast.Name)
                  and f.value.id in PROCESS_MODULES):
                found.append(f"{node.lineno}: {f.value.id}.{f.attr}(")
    return found


def test_jobs_start_and_signal_no_process():
    """Every process gpupack runs is the executor's (``scheduler.execute.local``: one supervisor, one way to end a
    group): a job kind under ``jobs/`` starts, signals and ends no process of its own (a command's script included)."""
    found = {module_name(p): process_uses(p) for p in (ROOT / "jobs").rglob("*.py")}
    assert {m: f for m, f in found.items() if f} == {}


def test_the_process_check_sees_a_job_that_runs_its_own_script(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, subprocess\nfrom subprocess import Popen\np = Popen(['x'])\nsubprocess.run(['y'])\n"
                   "os.killpg(p.pid, 9)\nos.environ.get('A')\n")
    assert process_uses(bad) == ["1: import subprocess", "2: from subprocess", "3: Popen(", "4: subprocess.run(",
                                 "5: os.killpg("]
