"""RocketMQ JSON quirks (protocol §3): fastjson writes maps with non-string keys bare (``{0:"a"}``).

``loads`` accepts both that and standard JSON; ``dumps`` writes standard JSON (quoted keys), which every
client we target reads.
"""

from __future__ import annotations

import re
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
