"""A ``clock_ms`` for code under test that takes an injected clock: it moves only when the test says so."""

from __future__ import annotations


class ManualClock:
    """``clock()`` -> the current time in ms; ``advance(ms)`` moves it (and returns the new time)."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms
