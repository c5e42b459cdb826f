"""The log throttle: repeated WARNING+ lines of one template are capped per window and counted."""

from __future__ import annotations

import logging

import pytest

from ferrymq.common.logthrottle import ThrottleFilter


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _record(msg: str, *args: object, level: int = logging.WARNING, name: str = "ferrymq.x") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_burst_then_suppressed_then_counted_in_the_next_window() -> None:
    clock = _Clock()
    flt = ThrottleFilter(burst=3, window_s=10, clock_s=clock)
    passed = [flt.filter(_record("closing %s: %s", f"127.0.0.1:{i}", "bad frame")) for i in range(1000)]
    assert passed.count(True) == 3 and passed[:3] == [True, True, True]
    clock.now_s += 10
    rec = _record("closing %s: %s", "127.0.0.1:1", "bad frame")
    assert flt.filter(rec)
    assert rec.getMessage() == "closing 127.0.0.1:1: bad frame [997 similar lines suppressed]"
    nxt = _record("closing %s: %s", "127.0.0.1:2", "bad frame")
    assert flt.filter(nxt) and "suppressed" not in nxt.getMessage()


def test_groups_are_per_template_logger_and_level_and_info_passes() -> None:
    flt = ThrottleFilter(burst=1, window_s=10, clock_s=_Clock())
    assert flt.filter(_record("a %s", 1)) and not flt.filter(_record("a %s", 2))
    assert flt.filter(_record("b %s", 1))
    assert flt.filter(_record("a %s", 3, name="ferrymq.y"))
    assert flt.filter(_record("a %s", 4, level=logging.ERROR))
    assert all(flt.filter(_record("a %s", i, level=logging.INFO)) for i in range(100))


def test_group_table_is_bounded() -> None:
    flt = ThrottleFilter(burst=1, window_s=10, clock_s=_Clock(), max_groups=8)
    for i in range(100):
        flt.filter(_record(f"template {i}"))
    assert len(flt._groups) == 8


def test_bad_settings_refused() -> None:
    with pytest.raises(ValueError):
        ThrottleFilter(burst=0)


def test_server_logging_throttles_only_its_own_handler() -> None:
    """A server started inside another program (a test runner with its own capture handler on the root logger)
    throttles its stderr handler only: the host's handler keeps every record (a throttle filter put on it stayed
    there for the rest of the run and hid later tests' repeated warnings)."""
    import logging

    from ferrymq.common import logthrottle

    root = logging.getLogger()
    host = logging.Handler()
    seen: list[logging.LogRecord] = []
    host.emit = seen.append  # type: ignore[method-assign]
    root.addHandler(host)
    before = list(root.handlers)
    level = root.level
    try:
        first = logthrottle.configure_server_logging("WARNING")
        assert logthrottle.configure_server_logging("WARNING") is first  # one handler, however often called
        assert host.filters == []
        for _ in range(logthrottle.LOG_BURST * 3):
            logging.getLogger("ferrymq.test").warning("same template %s", 1)
        assert len(seen) == logthrottle.LOG_BURST * 3
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
        root.removeHandler(host)
        root.setLevel(level)
