"""Helpers for the native-vs-pure dispatch tests: hand-built commit log streams, stores in either mode,
and a byte-level snapshot of what dispatch produced (no fixtures)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from store_helpers import FakeClock, make_config

from ferrymq.common.message import MessageExtBrokerInner
from ferrymq.common.message_codec import END_FILE_MIN_BLANK_LENGTH, blank_filler, encode_record
from ferrymq.store import MessageStore
from support.native import require_extension as require_extension

BORN_HOST = b"\x0a\x00\x00\x01\x00\x00\x30\x39"
STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x51\xaf"
HOST_V6_EXTRA = 12
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
#: (topic "TopicA") a key whose "TopicA#key" Java hash is Integer.MIN_VALUE (index key hash 0)
MIN_HASH_KEY = "VA4r2px"




@dataclass(frozen=True)
class RecordSpec:
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    properties: str
    body: bytes
    store_timestamp: int
    born_v6: bool = False
    store_v6: bool = False
    wrong_phy_field: bool = False


def encode_spec(spec: RecordSpec, phy_offset: int) -> bytes:
    """The record bytes (IPv4 via the repo's encoder; IPv6 hosts widened by hand)."""
    inner = MessageExtBrokerInner(
        topic=spec.topic, queue_id=spec.queue_id, body=spec.body, properties_string=spec.properties,
        sys_flag=spec.sys_flag, born_timestamp=1_600_000_000_000, born_host=BORN_HOST, store_host=STORE_HOST,
    )  # fmt: skip
    stored_phy = phy_offset + 7 if spec.wrong_phy_field else phy_offset
    record = encode_record(inner, spec.queue_offset, stored_phy, spec.store_timestamp)
    if not (spec.born_v6 or spec.store_v6):
        return record
    return widen_hosts(record, spec.born_v6, spec.store_v6)


def widen_hosts(record: bytes, born_v6: bool, store_v6: bool) -> bytes:
    """An IPv4 record rewritten with 20-byte (IPv6) born and/or store hosts."""
    total = int.from_bytes(record[0:4], "big", signed=True)
    sys_flag = int.from_bytes(record[36:40], "big", signed=True)
    extra = HOST_V6_EXTRA * (born_v6 + store_v6)
    sys_flag |= (SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    born = record[48:56]
    store = record[64:72]
    born = (b"\x20\x01" + bytes(10) + born[:4] + born[4:]) if born_v6 else born
    store = (b"\xfe\x80" + bytes(10) + store[:4] + store[4:]) if store_v6 else store
    head = (total + extra).to_bytes(4, "big", signed=True) + record[4:36] + sys_flag.to_bytes(4, "big", signed=True)
    return head + record[40:48] + born + record[56:64] + store + record[72:]


def build_stream(specs: list[RecordSpec], segment_size: int) -> bytes:
    """Records laid out as the commit log lays them out: a record that does not fit in its segment plus an
    8-byte filler ends the segment with a BLANK filler and opens the next one."""
    out = bytearray()
    for spec in specs:
        record = encode_spec(spec, len(out))
        left = segment_size - len(out) % segment_size
        if len(record) + END_FILE_MIN_BLANK_LENGTH > left:
            out += blank_filler(left) + bytes(left - END_FILE_MIN_BLANK_LENGTH)
            record = encode_spec(spec, len(out))
        out += record
    return bytes(out)


def set_mode(store: MessageStore, native: bool) -> None:
    """Switch a freshly loaded store to the native or the pure-Python dispatch path."""
    store.dispatcher.native = require_extension() if native else None
    store.commit_log.queue_metas = not native
    store.commit_log.native = store.dispatcher.native  # put_batch_raw


@contextlib.contextmanager
def stores_in_both_modes(**overrides: object) -> Iterator[tuple[MessageStore, MessageStore]]:
    """(native store, pure store) in a temporary directory, same config and clock; shut down after."""
    with tempfile.TemporaryDirectory(prefix="ferrymq-native-") as tmp:
        opened: list[MessageStore] = []
        try:
            for name, native in (("native", True), ("pure", False)):
                store = MessageStore(make_config(Path(tmp) / name, **overrides), FakeClock())
                store.load()
                opened.append(store)
                set_mode(store, native)
            yield opened[0], opened[1]
        finally:
            for store in opened:
                if store.running:
                    store.shutdown()


def dispatch_state(store: MessageStore) -> tuple[object, ...]:
    d = store.dispatcher
    return (dict(store.commit_log.topic_queue_table), d.reput_phy_offset, d.last_dispatch_timestamp,
            d.dispatched_total)


def files_snapshot(store: MessageStore) -> dict[str, bytes]:
    """Every consume queue and index file (headers written first), by path relative to the store root."""
    store.flush_consume_queues()
    root = Path(store.config.store_path_root_dir)
    out: dict[str, bytes] = {}
    for sub in ("consumequeue", "index"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def index_state(store: MessageStore) -> list[tuple[int, ...]]:
    assert store.index is not None
    return [(f.index_count, f.hash_slot_count, f.begin_timestamp, f.end_timestamp, f.begin_phy_offset,
             f.end_phy_offset) for f in store.index.files]


def cq_state(store: MessageStore) -> dict[tuple[str, int], tuple[int, int, int]]:
    return {key: (cq.max_phy_end, cq.min_logic_offset, cq.mfq.max_offset) for key, cq in store.queues.queues.items()}
