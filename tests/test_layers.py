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
