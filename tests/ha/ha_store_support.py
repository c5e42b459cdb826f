"""Real MessageStore helpers for the HA integration tests."""

from __future__ import annotations

from pathlib import Path

from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.store.config import BrokerRole, StoreConfig
from ferrymq.store.message_store import MessageStore
from ferrymq.store.results import GetMessageStatus, PutMessageStatus

SEGMENT = 1024 * 1024
TOPIC = "HaTopic"


def open_store(root: Path, role: BrokerRole, segment: int = SEGMENT) -> MessageStore:
    cfg = StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=segment,
        mapped_file_size_consume_queue=20 * 10_000,
        broker_role=role,
        index_hash_slot_num=1024,
        index_max_num=8192,
        total_memory_bytes=1 << 30,
    )
    store = MessageStore(cfg)
    store.load()
    return store


def make_inner(i: int, queue_id: int, body_size: int = 300) -> MessageExtBrokerInner:
    body = (f"msg-{i:08d}-".encode() * (body_size // 13 + 1))[:body_size]
    return MessageExtBrokerInner(
        topic=TOPIC,
        queue_id=queue_id,
        body=body,
        properties_string=properties_to_string({"TAGS": "t", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:012d}"}),
        born_timestamp=1_600_000_000_000 + i,
    )


def put_n(store: MessageStore, start: int, n: int, queues: int = 4, body_size: int = 300) -> list[int]:
    """Put messages start..start+n-1 round-robin over ``queues``; return each end phy offset."""
    ends: list[int] = []
    for i in range(start, start + n):
        res = store.put_message(make_inner(i, i % queues, body_size))
        assert res.status is PutMessageStatus.PUT_OK, res
        ar = res.append_result
        assert ar is not None
        ends.append(ar.wrote_offset + ar.wrote_bytes)
    store.reput()  # the master's own consume queues (the broker does this on its dispatch path)
    return ends


def commit_log_bytes(store: MessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    pos = start
    while pos < end:
        chunk = store.read_from(pos, end - pos)
        assert chunk, f"hole at {pos}"
        out += chunk
        pos += len(chunk)
    return bytes(out)


def read_queue_bodies(store: MessageStore, queue_id: int, start: int, end: int) -> list[bytes]:
    from ferrymq.common.message_codec import decode_record

    bodies: list[bytes] = []
    for qoff in range(start, end):
        res = store.get_message("g", TOPIC, queue_id, qoff, 1, None)
        assert res.status is GetMessageStatus.FOUND, (queue_id, qoff, res.status)
        bodies.append(decode_record(res.buffers[0]).body)
    return bodies
