"""Every path the docs name exists: README.md and docs/**/*.md, their markdown links (relative to the doc, anchors
dropped) and the repository paths they name in backticks (``scheduler/policy/running/budget.py``, ``benchmarks/peers.py``,
``docs/budget/``, ``tests/test_budget.py::test_name`` with its test function, ``policy/memory/estimate.py`` read under
``scheduler/``). Not checked: web addresses, paths a run writes (``jobs/<job>/launch.json``, anything with ``<``,
``*``, ``$`` or ``…``), and ``../shared/…``, which is beside the checkout on the development machine, not in a clone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# the first segment of a path the docs name in backticks: the repository's folders, and scheduler's layers (the docs
# write `policy/memory/estimate.py` for scheduler/policy/memory/estimate.py)
TOP = ("scheduler", "jobs", "benchmarks", "tests", "docs", "plans", ".ci")
LAYERS = ("core", "policy", "execute", "runtime", "store", "service", "cli")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
SUFFIXES = (".py", ".md", ".json", ".yaml", ".yml", ".sh", ".toml", "/")


def links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def named_paths(text: str) -> list[str]:
    """Backticked tokens that are repository paths: a known first segment, a file suffix or a folder's slash."""
    out = []
    for token in CODE.findall(text):
        path = token.split("::")[0]
        if any(c in token for c in "<>*$…{}|") or path.startswith("../"):
            continue
        first = path.split("/")[0]
        if "/" in path and first in TOP + LAYERS and path.endswith(SUFFIXES):
            out.append(token)
    return out


def exists(doc: Path, path: str) -> bool:
    candidates = [doc.parent / path, ROOT / path]
    if path.split("/")[0] in LAYERS:
        candidates.append(ROOT / "scheduler" / path)
    return any(c.exists() for c in candidates)


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+\s+(.+?)\s*$", doc.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def missing_in(doc: Path) -> list[str]:
    text = doc.read_text()
    bad = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        where = doc.parent / path if path else doc
        if not where.exists():
            bad.append(f"link ({target})")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"link ({target}): no heading #{anchor}")
    for token in named_paths(text):
        path, _, test = token.partition("::")
        if not exists(doc, path):
            bad.append(f"path `{token}`")
        elif test and path.endswith(".py"):
            name = test.split("[")[0].split("::")[-1]
            source = next(c for c in (doc.parent / path, ROOT / path) if c.exists()).read_text()
            if not re.search(rf"^\s*(?:async\s+)?(?:def|class) {re.escape(name)}\b", source, re.MULTILINE):
                bad.append(f"test `{token}`: no def {name}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_path_a_doc_names_exists(doc):
    assert missing_in(doc) == []


def test_the_check_finds_a_missing_path(tmp_path):
    doc = tmp_path / "x.md"
    (tmp_path / "y.md").write_text("# A heading, with `code`\n")
    doc.write_text("See [here](nowhere.md), [there](y.md#a-heading-with-code), [not](y.md#b), `scheduler/policy/nothing_here.py`, `policy/running/budget.py`, "
                   "`tests/test_docs_links.py::test_not_a_test`, `jobs/<job>/launch.json`, [web](https://x.org).")
    assert missing_in(doc) == ["link (nowhere.md)", "link (y.md#b): no heading #b", "path `scheduler/policy/nothing_here.py`",
                               "test `tests/test_docs_links.py::test_not_a_test`: no def test_not_a_test"]
