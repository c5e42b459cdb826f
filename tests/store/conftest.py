"""Fixtures for store tests (helpers live in ``store_helpers``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_helpers import FakeClock, make_config

from ferrymq.store import MessageStore


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_store(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., MessageStore]]:
    """open_store(name="a", **config) -> a loaded store; shut down at teardown if still running."""
    stores: list[MessageStore] = []

    def _open(name: str = "a", **overrides: object) -> MessageStore:
        store = MessageStore(make_config(tmp_path / name, **overrides), clock)
        store.load()
        stores.append(store)
        return store

    yield _open
    for store in stores:
        if store.running:
            store.shutdown()
