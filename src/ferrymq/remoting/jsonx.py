"""RocketMQ JSON quirks (protocol §3): fastjson writes maps with non-string keys bare (``{0:"a"}``), and
maps whose keys are objects with the key object itself in key position
(``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``, e.g. ``Map<MessageQueue, X>``).

``loads`` accepts bare numeric keys and standard JSON; ``dumps`` writes standard JSON (quoted keys), which
every client we target reads. ``object_keyed`` renders a map with object keys in fastjson's shape, for the
admin bodies Java tools decode that way (GET_TOPIC_STATS_INFO, GET_CONSUME_STATS); it is not JSON, and
readers turn the key objects back into values first (``ferrymq.client.jsonmq``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

_BARE_KEY = re.compile(rb'([{,]\s*)(-?\d+)(\s*:)')


def loads(data: bytes | str) -> Any:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return orjson.loads(_BARE_KEY.sub(rb'\1"\2"\3', raw))


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def dumps_pretty(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def object_keyed(pairs: Iterable[tuple[Mapping[str, Any], Any]]) -> orjson.Fragment:
    """A map whose keys are JSON objects, written as fastjson does (``{{key fields}:value,...}``), for use
    as a value inside ``dumps``. Key fields are written in sorted order, like fastjson's field order."""
    parts = [orjson.dumps(dict(key), option=orjson.OPT_SORT_KEYS) + b":" + dumps(value) for key, value in pairs]
    return orjson.Fragment(b"{" + b",".join(parts) + b"}")
