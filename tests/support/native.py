"""The optional C extensions in tests: present, or a failure under CI (CI=true) and a skip elsewhere — so a
broken build cannot pass CI as if the native paths had been tested."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ferrymq.store import speedups


def require_built(native: Any, name: str) -> Any:
    """``native`` (a built extension or one of its functions); None fails under CI and skips elsewhere."""
    if native is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} was not built (CI must build the C extensions)")
        pytest.skip(f"{name} not built here")
    return native


def require_extension() -> Any:
    """The built ``ferrymq.store._speedups`` module."""
    return require_built(speedups.EXTENSION, "ferrymq.store._speedups")
