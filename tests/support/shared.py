"""Where the recorded client frames live: ``tests/fixtures/captures`` in this repository (see its README),
so a clone on its own runs every test that replays them."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES = REPO_ROOT / "tests" / "fixtures" / "captures"
