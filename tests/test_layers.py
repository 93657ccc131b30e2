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


def import_graph(root: Path, paths: list[Path]) -> dict[str, dict[str, int]]:
    """Module -> {module of gpupack it imports: first line}, module-level and function-level imports alike (a function
    that imports a module when it runs closes a circle as surely as the top of the file does). ``from a.b import c``
    is an edge to ``a.b.c`` when that is a module, else to ``a.b``; a package's ``__init__`` is the package's name."""
    def name(path: Path) -> str:
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    named = {name(p): p for p in paths}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in named.items():
        edges = graph.setdefault(mod, {})
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in named else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                if t in named:
                    edges.setdefault(t, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The circles in ``graph``: each strongly connected set of two or more modules (or one that imports itself),
    sorted, found by Tarjan's algorithm (iterative: the graph is a few hundred modules deep at most)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1 or v in graph.get(v, {}):
                    found.append(sorted(group))
    return sorted(found)


def test_no_import_circle_in_scheduler_or_jobs():
    """No module of ``scheduler/`` or ``jobs/`` reaches itself through imports, those inside functions included: a
    circle means two ideas lean on each other, and a function-level import only hides it from the interpreter (the
    policy had one: colocation -> timemodel -> dryrun, through ``fold_train_rows``, now in ``core/folds``)."""
    graph = import_graph(ROOT, modules())
    circles = [" -> ".join(c + [c[0]]) + "  (" + "; ".join(f"{a}:{graph[a][b]} imports {b}" for a in c for b in c
                                                           if b in graph[a]) + ")" for c in import_cycles(graph)]
    assert circles == [], "\n".join(circles)


def test_the_circle_check_itself_sees_a_circle(tmp_path):
    """A made-up pair that import each other, one of them inside a function, is a circle; a third that only imports
    them is not in it, and a chain with no way back is none."""
    pkg = tmp_path / "scheduler" / "policy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from scheduler.policy import b\n")
    (pkg / "b.py").write_text("def f():\n    from scheduler.policy.a import g\n    return g\n")
    (pkg / "c.py").write_text("import scheduler.policy.a\nfrom scheduler.policy.b import f\n")
    graph = import_graph(tmp_path, sorted(pkg.glob("*.py")))
    assert graph["scheduler.policy.b"] == {"scheduler.policy.a": 2}
    assert import_cycles(graph) == [["scheduler.policy.a", "scheduler.policy.b"]]
    (pkg / "b.py").write_text("import math\n")
    assert import_cycles(import_graph(tmp_path, sorted(pkg.glob("*.py")))) == []


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


def test_a_command_jobs_process_starts_without_scikit_learn_or_torch():
    """What a task's process imports before its job's own work: the actor, the record's schema, the competition
    reader and the command backend. scikit-learn (about a second of CPU, once pulled in by the metrics module) and
    torch belong to the kinds and metrics that use them: four tasks starting on two cores each paid it, and the
    first wave came up a third slower than bare Ray's."""
    import subprocess
    import sys

    code = ("import sys; import scheduler.execute.ray_actor, scheduler.execute.apply, scheduler.core.plan, jobs, "
            "jobs.data, jobs.command_job, scheduler.execute.script, scheduler.core.scoring as s; "
            "s.get('accuracy')([0, 1], [[0.9, 0.1], [0.2, 0.8]]); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'torch', 'lightgbm', 'timm'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


HEAVY = {"pandas", "torch", "timm", "sklearn", "lightgbm", "xgboost"}


def _loaded(code: str, env: dict | None = None) -> dict:
    """What a fresh interpreter holds after ``code``: {"gpupack": its modules of scheduler and jobs, "top": every
    top-level module}, as the code's last line prints them."""
    import json
    import os
    import subprocess
    import sys

    probe = (f"{code}\nimport json as _j, sys as _s\n"
             "print(_j.dumps({'gpupack': sorted(m for m in _s.modules if m.split('.')[0] in ('scheduler', 'jobs')),"
             " 'top': sorted({m.split('.')[0] for m in _s.modules})}))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **(env or {})})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_package_root_imports_nothing():
    """``scheduler/__init__.py`` imports nothing (it imported ``jobs`` to fill the kinds' registry: every process
    that touched gpupack, a job actor included, loaded 28 modules, pandas and pydantic, 1.45 s); the registry is
    filled when it is first asked (``core.kinds.load``). ``import scheduler.core.units`` loads that module alone."""
    root = ast.parse((ROOT / "scheduler" / "__init__.py").read_text())
    assert [n.lineno for n in ast.walk(root) if isinstance(n, (ast.Import, ast.ImportFrom))] == []
    found = _loaded("import scheduler.core.units")
    assert found["gpupack"] == ["scheduler", "scheduler.core", "scheduler.core.units"]
    assert not {"pydantic", "pandas", "numpy", "yaml"} & set(found["top"])


@pytest.mark.parametrize("kind", ["timm", "lightgbm", "xgboost", "command"])
def test_a_job_actors_process_imports_no_pandas_torch_or_timm_before_its_job_asks(kind):
    """A job actor's process — its class's module (``execute.ray_job``), the record's runner (``execute.apply``), the
    record itself unpickled (its spec brings its own kind's module) and its kind looked up — loads none of pandas,
    torch, timm, scikit-learn, LightGBM or XGBoost: those are its job's to import when it runs. So each launch pays
    only for what its job uses (an actor's import was 864 ms with the registry loaded by ``import scheduler``)."""
    from scheduler.core.plan import job_from_dict
    from scheduler.execute.launch import ENV, LaunchRecord, dumps

    asks = {"timm": {"model": "resnet18", "batch_size": 32}, "command": {"command": ["true"]}}.get(kind, {})
    record = LaunchRecord(task="t", job="t", spec=job_from_dict({"kind": kind, **asks}), data_dir=".", workdir=".",
                          metric="accuracy", seed=0)
    found = _loaded("import os\nimport scheduler.execute.ray_job, scheduler.execute.apply\n"
                    "from scheduler.core import kinds\nfrom scheduler.execute.launch import loads\n"
                    f"kinds.of(loads(os.environ[{ENV!r}]).spec)", env={ENV: dumps(record)})
    assert HEAVY & set(found["top"]) == set()


def test_a_job_actors_class_comes_with_ray_its_line_and_its_buffer_alone():
    """Ray imports an actor's class by its module in the worker, and the first poll it answers is the sign the
    process is up: ``execute.ray_job`` brings none of the executor's modules (the record, the kind registry, the run's
    messages), which cost each launch 48 ms before its first answer when the class lived beside the executor
    (``benchmarks/overhead.py``: per launch 1.08 of a bare Ray actor)."""
    found = _loaded("import scheduler.execute.ray_job")
    assert found["gpupack"] == ["scheduler", "scheduler.core", "scheduler.core.actorline", "scheduler.core.progress",
                                "scheduler.execute", "scheduler.execute.channel", "scheduler.execute.ray_job"]
    from scheduler.execute.ray_actor import RemoteJobActor

    assert RemoteJobActor.__ray_metadata__.modified_class.__module__ == "scheduler.execute.ray_job"


def test_the_import_check_itself_sees_a_heavy_import():
    """The same probe sees what a module brings: the boosting kinds' fold loop (``jobs.boosting``, which their runs
    import) brings pandas, which the actor above never asks for."""
    found = _loaded("import jobs.boosting")
    assert "pandas" in found["top"] and "jobs.boosting" in found["gpupack"]
