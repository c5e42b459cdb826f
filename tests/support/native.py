"""The store's optional C extension in tests: present, or a failure under CI (CI=true) and a skip
elsewhere — so a broken build cannot pass CI as if the native paths had been tested."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ferrymq.store import speedups


def require_extension() -> Any:
    """The built ``ferrymq.store._speedups`` module."""
    if speedups.EXTENSION is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ferrymq.store._speedups was not built (CI must build the C extension)")
        pytest.skip("ferrymq.store._speedups not built here")
    return speedups.EXTENSION
