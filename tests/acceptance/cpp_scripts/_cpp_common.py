"""Shared bits of the C++-client scripts (run in subprocesses, never imported by pytest).

Each script takes one JSON object as argv[1], appends one JSON line per event to ``out`` (flushed at
once, so a SIGKILLed script still leaves what it saw), and prints one JSON summary line on stdout.
Message bodies are NUL-free: the 0.4.4 wrapper's ``Message.set_body`` cuts at the first NUL byte.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

#: property carrying the test's sequence number
SEQ_PROP = "seq"
#: user property checked for exact round trip
USER_PROP = "myprop"


def args() -> dict[str, Any]:
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} '<json object>'")
    parsed: dict[str, Any] = json.loads(sys.argv[1])
    return parsed


def now_ms() -> int:
    return int(time.time() * 1000)


class JsonLines:
    """Thread-safe append-only JSON-lines writer, flushed per line."""

    def __init__(self, path: str | None) -> None:
        self._lock = threading.Lock()
        self._f = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def write(self, obj: dict[str, Any]) -> None:
        if self._f is None:
            return
        line = json.dumps(obj, sort_keys=True)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            with self._lock:
                self._f.close()


def expected_message(prefix: str, seq: int, tags: list[str], body_pad: int = 0) -> dict[str, Any]:
    """The message a producer sends for ``seq`` (the consumer side recomputes it to compare)."""
    return {
        "seq": seq,
        "body": f"{prefix}-body-{seq}-" + ("x" * body_pad),
        "keys": f"{prefix}-key-{seq}",
        "tags": tags[seq % len(tags)],
        "prop": f"{prefix}-v-{seq}",
    }


def build_message(message_cls: Any, topic: str, exp: dict[str, Any], delay_level: int = 0) -> Any:
    """The client's ``Message`` for ``expected_message``'s ``exp``; ``message_cls`` is the ``rocketmq.client.Message``
    of whichever client package runs the script (the 1.x and 2.1 bindings share this API)."""
    msg = message_cls(topic)
    msg.set_keys(exp["keys"])
    msg.set_tags(exp["tags"])
    msg.set_body(exp["body"])
    msg.set_property(SEQ_PROP, str(exp["seq"]))
    msg.set_property(USER_PROP, exp["prop"])
    if delay_level:
        msg.set_delay_time_level(delay_level)
    return msg


def summary(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def hard_exit(code: int = 0) -> None:
    """Leave without running the C++ destructors (they can hang after a failed shutdown)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
