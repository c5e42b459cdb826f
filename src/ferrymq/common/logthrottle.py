"""Rate limiting of repeated log lines: a hostile or broken peer must not fill the disk with logs.

A ``ThrottleFilter`` sits on the log handlers of a server process (``install``). Records at WARNING and above
are grouped by (logger name, level, message template): the ``%s`` placeholders are not filled in yet, so
"closing 10.0.0.1:5: bad frame" and "closing 10.0.0.2:7: bad frame" are the same line. Each group may print
``LOG_BURST`` records per ``LOG_WINDOW_S`` window; the rest of the window's records are counted, not printed,
and the group's next printed record says how many were left out::

    closing 127.0.0.1:40312: invalid frame length -1 [412 similar lines suppressed]

INFO and DEBUG records pass untouched. The filter keeps at most ``MAX_GROUPS`` groups (the oldest window
is dropped first), so its memory is bounded too.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

#: records of one group printed per window
LOG_BURST = 5
#: window length in seconds
LOG_WINDOW_S = 10.0
#: most groups tracked at once
MAX_GROUPS = 1024


class _Group:
    __slots__ = ("window_start_s", "printed", "suppressed")

    def __init__(self, now_s: float) -> None:
        self.window_start_s = now_s
        self.printed = 0
        self.suppressed = 0


class ThrottleFilter(logging.Filter):
    """Lets at most ``burst`` records of a group through per ``window_s``; see the module docstring."""

    def __init__(self, *, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S,
                 clock_s: Callable[[], float] = time.monotonic, max_groups: int = MAX_GROUPS) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0 or max_groups < 1:
            raise ValueError("burst and max_groups must be >= 1 and window_s > 0")
        self.burst = burst
        self.window_s = window_s
        self.max_groups = max_groups
        self._clock_s = clock_s
        self._groups: dict[tuple[str, int, str], _Group] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now_s = self._clock_s()
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) >= self.max_groups:
                del self._groups[next(iter(self._groups))]
            group = self._groups[key] = _Group(now_s)
        elif now_s - group.window_start_s >= self.window_s:
            suppressed = group.suppressed
            group.window_start_s, group.printed, group.suppressed = now_s, 0, 0
            if suppressed:
                record.msg = f"{record.msg} [{suppressed} similar lines suppressed]"
        if group.printed < self.burst:
            group.printed += 1
            return True
        group.suppressed += 1
        return False


def install(logger: logging.Logger | None = None, *, burst: int = LOG_BURST,
            window_s: float = LOG_WINDOW_S) -> ThrottleFilter:
    """Put one ThrottleFilter on every handler of ``logger`` (the root logger by default) and return it."""
    target = logger if logger is not None else logging.getLogger()
    flt = ThrottleFilter(burst=burst, window_s=window_s)
    for handler in target.handlers:
        handler.addFilter(flt)
    return flt


#: the log line format of the server processes (name server, broker, controller, proxy)
SERVER_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record (a test runner swaps it per test)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_server_logging(level: str, fmt: str = SERVER_LOG_FORMAT) -> ThrottleFilter:
    """A server process's logging: records at ``level`` and above to stderr through a ThrottleFilter. Only the
    handler added here is throttled: handlers others put on the root logger (a test runner's log capture, when a
    server runs inside it) are left as they are. A second call keeps the first handler and its filter."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, _StderrHandler):
            for flt in handler.filters:
                if isinstance(flt, ThrottleFilter):
                    return flt
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(fmt))
    throttle = ThrottleFilter()
    handler.addFilter(throttle)
    root.addHandler(handler)
    root.setLevel(level)
    return throttle

