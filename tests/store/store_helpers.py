"""Helpers for store tests: tiny segment sizes, a fake clock, record scanning (no fixtures)."""

from __future__ import annotations

from pathlib import Path

from ferrymq.common.message import MessageExtBrokerInner, properties_to_string
from ferrymq.common.message_codec import RecordCheck, check_record, decode_record_meta
from ferrymq.store import MessageStore, StoreConfig

CL_SEGMENT = 64 * 1024


def segment_files(directory: Path) -> list[Path]:
    """The segment files of a commit log directory, in order (not the ``.prep`` one being warmed)."""
    return sorted(p for p in directory.iterdir() if p.name.isdigit())
CQ_FILE = 20 * 100


class FakeClock:
    def __init__(self, start_ms: int = 1_700_000_000_000, step_ms: int = 1) -> None:
        self.now_ms = start_ms
        self.step_ms = step_ms

    def __call__(self) -> int:
        self.now_ms += self.step_ms
        return self.now_ms


def make_config(root: Path, **overrides: object) -> StoreConfig:
    params: dict[str, object] = dict(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=CL_SEGMENT,
        mapped_file_size_consume_queue=CQ_FILE,
        index_hash_slot_num=64,
        index_max_num=256,
        total_memory_bytes=1 << 30,
    )
    params.update(overrides)
    return StoreConfig(**params)  # type: ignore[arg-type]


def inner(
    topic: str = "TopicA",
    queue_id: int = 0,
    body: bytes = b"hello",
    tags: str | None = None,
    keys: str | None = None,
    uniq: str | None = None,
    extra: dict[str, str] | None = None,
    sys_flag: int = 0,
) -> MessageExtBrokerInner:
    props: dict[str, str] = {}
    if tags is not None:
        props["TAGS"] = tags
    if keys is not None:
        props["KEYS"] = keys
    if uniq is not None:
        props["UNIQ_KEY"] = uniq
    props.update(extra or {})
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties_string=properties_to_string(props),
        sys_flag=sys_flag,
        born_timestamp=1_600_000_000_000,
        born_host=b"\x0a\x00\x00\x01\x00\x00\x30\x39",
        store_host=b"\x7f\x00\x00\x01\x00\x00\x51\xaf",
    )


def scan_records(store: MessageStore, with_tran: bool = False, check_crc: bool = True
                 ) -> list[tuple[int, str, int, int, int]]:
    """(phy_offset, topic, queue_id, queue_offset, size) of every record (by walking the commit
    log); prepared/rollback transaction records are left out unless ``with_tran``."""
    out: list[tuple[int, str, int, int, int]] = []
    for mf in store.commit_log.mfq.files:
        pos = max(0, store.min_phy_offset - mf.file_from_offset)
        while pos < mf.wrote_position:
            status, size = check_record(mf.mm, pos, check_crc, end=mf.wrote_position)
            if status is RecordCheck.BLANK:
                break
            assert status is RecordCheck.OK, (status, mf.file_from_offset + pos)
            meta = decode_record_meta(mf.mm, pos)
            if with_tran or (meta.sys_flag & 0xC) not in (0x4, 0xC):
                out.append((mf.file_from_offset + pos, meta.topic, meta.queue_id, meta.queue_offset, size))
            pos += size
    return out


def assert_cqs_match_commit_log(store: MessageStore, check_crc: bool = True) -> None:
    """Every queue's units are exactly the commit log's records of that queue, in order."""
    expected: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for phy, topic, qid, qoff, size in scan_records(store, check_crc=check_crc):
        expected.setdefault((topic, qid), []).append((qoff, phy, size))
    for (topic, qid), recs in expected.items():
        lo = store.get_min_offset_in_queue(topic, qid)
        hi = store.get_max_offset_in_queue(topic, qid)
        want = [(phy, size) for qoff, phy, size in recs if qoff >= lo]
        units = store.get_consume_queue_units(topic, qid, lo, hi - lo)
        assert [(p, s) for p, s, _t in units] == want, (topic, qid)
        assert [q for q, _p, _s in recs if q >= lo] == list(range(lo, hi))
    for topic, qids in store.topic_queue_ids().items():
        for qid in qids:
            if (topic, qid) not in expected:
                assert store.get_max_offset_in_queue(topic, qid) == store.get_min_offset_in_queue(topic, qid)


def flip_byte(store: MessageStore, phy_offset: int, rel: int) -> None:
    """Damage the commit log in place: flip bit 6 of the byte ``rel`` bytes into the record at ``phy_offset``."""
    mf = store.commit_log.mfq.find(phy_offset)
    assert mf is not None
    pos = phy_offset - mf.file_from_offset + rel
    mf.write_at(pos, bytes([mf.mm[pos] ^ 0x40]))
