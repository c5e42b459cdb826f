"""Reading and writing fastjson maps keyed by MessageQueue objects.

Java writes ``Map<MessageQueue, X>`` as ``{{"brokerName":"b","queueId":0,"topic":"t"}:X, ...}``, which is
not JSON. We turn each object key into a string key first, then parse. Two list shapes are accepted too:
``[{"brokerName","queueId","topic", ...value fields}]`` (the C++ client's offset tables) and
``[{"messageQueue":{...}, <one value field>:{...}}]`` (the admin bodies of earlier ferrymq brokers). ``dumps_mq_keys`` writes that
fastjson shape (what Java's admin tools decode and the C++ client sends), everything else as plain JSON.
"""

from __future__ import annotations

import re
from typing import Any

from ferrymq.common.route import MessageQueue
from ferrymq.errors import ProtocolError
from ferrymq.remoting import jsonx

_MQ_KEY = re.compile(
    rb'\{\s*((?:"(?:brokerName|queueId|topic)"\s*:\s*(?:"(?:[^"\\]|\\.)*"|-?\d+)\s*,?\s*){3})\}\s*:')
_MQ_PREFIX = "\x00mq:"


def _key_sub(match: re.Match[bytes]) -> bytes:
    inner = b"{" + match.group(1).rstrip(b", \t\r\n") + b"}"
    return jsonx.dumps(_MQ_PREFIX + inner.decode("utf-8")) + b":"


def loads_mq_keys(data: bytes) -> Any:
    try:
        return jsonx.loads(data)
    except Exception:
        return jsonx.loads(_MQ_KEY.sub(_key_sub, data))


def _mq(field: str, obj: Any) -> MessageQueue:
    try:
        return MessageQueue.from_json(obj)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"{field}: not a MessageQueue: {obj!r} ({type(exc).__name__}: {exc})") from None


def mq_keyed_map(data: bytes, field: str) -> list[tuple[MessageQueue, Any]]:
    """The (queue, value) pairs of the map or list ``field`` of the body ``data``; ProtocolError when the
    body is not one of the shapes above."""
    try:
        obj = loads_mq_keys(data)
    except ValueError as exc:
        raise ProtocolError(f"{field}: body is not JSON ({exc})") from None
    return mq_table_entries(obj.get(field) if isinstance(obj, dict) else None, field)


def mq_table_entries(table: Any, field: str) -> list[tuple[MessageQueue, Any]]:
    """The (queue, value) pairs of one MessageQueue-keyed table already parsed by ``loads_mq_keys`` (a map or
    one of the list shapes above), e.g. a table nested deeper than the body's top level."""
    out: list[tuple[MessageQueue, Any]] = []
    if isinstance(table, list):
        for item in table:
            if not isinstance(item, dict):
                raise ProtocolError(f"{field}: a list entry is not an object: {item!r}")
            mq_obj = item.get("messageQueue")
            if isinstance(mq_obj, dict):
                values = [v for k, v in item.items() if k != "messageQueue"]
                out.append((_mq(field, mq_obj), values[0] if len(values) == 1 else item))
            else:
                out.append((_mq(field, item), item))
    elif isinstance(table, dict):
        for key, value in table.items():
            if key.startswith(_MQ_PREFIX):
                out.append((_mq(field, jsonx.loads(key[len(_MQ_PREFIX):])), value))
            elif isinstance(value, dict) and {"topic", "brokerName", "queueId"} <= value.keys():
                out.append((_mq(field, value), value))
    return out


def dumps_mq_keys(obj: Any) -> bytes:
    """``jsonx.dumps``, except that a dict whose keys are MessageQueues becomes a fastjson object-keyed
    map (``mq_keyed_map``/``loads_mq_keys`` read it back)."""
    if isinstance(obj, dict):
        if obj and all(isinstance(k, MessageQueue) for k in obj):
            items = sorted(obj.items())
            return b"{" + b",".join(jsonx.dumps(k.to_json()) + b":" + dumps_mq_keys(v) for k, v in items) + b"}"
        return b"{" + b",".join(jsonx.dumps(str(k)) + b":" + dumps_mq_keys(v) for k, v in obj.items()) + b"}"
    if isinstance(obj, (list, tuple)):
        return b"[" + b",".join(dumps_mq_keys(v) for v in obj) + b"]"
    return jsonx.dumps(obj)
