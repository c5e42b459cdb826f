"""Where the steering repo's ``shared/`` folder sits: beside this repository's checkout (CI clones it there).
Tests that need its protocol captures skip when it is absent."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = REPO_ROOT.parent / "shared"
CAPTURES = SHARED_DIR / "protocol" / "captures"
