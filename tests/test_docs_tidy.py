"""The documents a user or a newcomer reads (README, CONTRIBUTING, docs/) carry no machine paths and no
links to files that do not exist (e.g. a removed page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the user-facing documents
DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "benchmarks" / "README.md",
               *(REPO / "docs").rglob("*.md")])
#: absolute paths of one machine (home or work directories), never meaningful to a reader
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|Users|root)/\w")
#: a markdown link [text](target)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_contributing_guide_is_at_the_root() -> None:
    assert (REPO / "CONTRIBUTING.md").is_file()
    assert not (REPO / "docs" / "CONTRIBUTING-agents.md").exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_machine_paths(doc: Path) -> None:
    hits = [f"{doc.name}:{n}: {line.strip()}" for n, line in enumerate(doc.read_text().splitlines(), 1)
            if MACHINE_PATH.search(line)]
    assert not hits, hits


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, broken
