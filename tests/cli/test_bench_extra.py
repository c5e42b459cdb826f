"""``ferry bench``'s Redis rows depend on the PyPI package ``redis``: it is declared in the ``bench`` extra,
and a missing one is reported with the install command for that extra."""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from ferrymq.cli.bench_impl import redis_peer

ROOT = Path(__file__).resolve().parents[2]


def test_bench_extra_declares_redis() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in extras["bench"]}
    assert "redis" in names


def test_missing_redis_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    reason = redis_peer.available()
    assert reason is not None and "ferrymq[bench]" in reason


def test_benchmarks_readme_says_how_to_get_the_redis_rows() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert "ferrymq[bench]" in text
