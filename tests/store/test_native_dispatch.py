"""The native reput (ferrymq.store._speedups) builds exactly what the pure-Python reput builds: the same
consume queue and index bytes, topic queue table, reput offset, timestamps, counters and log lines, for
replicated streams (slave) and for puts (master), on hypothesis-generated records."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from dispatch_streams import (
    MIN_HASH_KEY,
    RecordSpec,
    build_stream,
    cq_state,
    dispatch_state,
    files_snapshot,
    index_state,
    require_extension,
    stores_in_both_modes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import inner

from ferrymq.common.message_codec import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE
from ferrymq.store import MessageStore

SEGMENT_SIZE = 4096  # small commit log segments: BLANK fillers every few dozen records
START_TS = 1_700_000_000_000
# plain ASCII topics most of the time (the native scan's records), the others now and then
TOPICS = ["TopicA"] * 6 + ["TopicB"] * 4 + ["SCHEDULE_TOPIC_XXXX", "Tópico", "a/b", ".", "..", "T\x00x", "%RETRY%g"]
PUT_TOPICS = ["TopicA"] * 4 + ["TopicB"] * 2 + ["SCHEDULE_TOPIC_XXXX", "Tópico"]
NAMES = ["TAGS", "KEYS", "UNIQ_KEY"] * 3 + ["DELAY", "WAIT", "XTAGS", "TAG", "KEYSX", "tags"]
ASCII_VALUE_ALPHABET = "abcXYZ019 #-_.\x01"
VALUE_ALPHABET = ASCII_VALUE_ALPHABET + "é漢"
SYS_FLAGS = [0] * 8 + [0x4, 0x8, 0xC, 0x1, 0x2]
QUEUE_OFFSET_STEPS = [1] * 12 + [0, 2, -1, -5, 120]
TIMESTAMP_STEPS = [1, 1, 0, 1500, -2000, 10**6, 1 << 40]
TAILS = ["none", "truncated", "garbage", "zeros", "bad_blank", "bad_lengths", "long_total", "v6_truncated"]
EXAMPLES = 60

value_st = st.one_of(
    st.text(alphabet=ASCII_VALUE_ALPHABET, max_size=12),
    st.text(alphabet=ASCII_VALUE_ALPHABET, max_size=12),
    st.text(alphabet=ASCII_VALUE_ALPHABET, max_size=12),
    st.text(alphabet=VALUE_ALPHABET, max_size=12),
    st.sampled_from([MIN_HASH_KEY, f"{MIN_HASH_KEY} {MIN_HASH_KEY}", "  a  b ", ""]),
    st.text(alphabet="ab", min_size=500, max_size=700),
)
item_st = st.one_of(
    st.tuples(st.sampled_from(NAMES), value_st).map(lambda nv: f"{nv[0]}\x01{nv[1]}"),
    st.tuples(st.sampled_from(NAMES), value_st).map(lambda nv: f"{nv[0]}\x01{nv[1]}"),
    st.text(alphabet="ab\x01 TAGS", max_size=6),  # junk items
)
properties_st = st.tuples(st.booleans(), st.lists(item_st, max_size=6), st.booleans()).map(
    lambda t: ("\x02" if t[0] else "") + "\x02".join(t[1]) + ("\x02" if t[2] else "")
)
raw_record_st = st.tuples(
    st.sampled_from(TOPICS),
    st.integers(0, 5),
    st.sampled_from(QUEUE_OFFSET_STEPS),
    st.sampled_from(SYS_FLAGS),
    properties_st,
    st.integers(0, 120),
    st.sampled_from(TIMESTAMP_STEPS),
    st.sampled_from([(False, False)] * 12 + [(True, False), (False, True), (True, True)]),
    st.booleans(),
)


def to_specs(raw: list[tuple]) -> list[RecordSpec]:  # type: ignore[type-arg]
    """Queue offsets continue per queue (mostly +1, with gaps, repeats and steps back); timestamps drift."""
    next_offsets: dict[tuple[str, int], int] = {}
    ts = START_TS
    specs = []
    for topic, queue_id, step, sys_flag, props, body_len, ts_step, (born_v6, store_v6), wrong_phy in raw:
        key = (topic, queue_id)
        queue_offset = max(0, next_offsets.get(key, 0) + step - 1)
        next_offsets[key] = queue_offset + 1
        ts += ts_step
        specs.append(RecordSpec(topic, queue_id, queue_offset, sys_flag, props, bytes(range(body_len)), ts,
                                born_v6, store_v6, wrong_phy))  # fmt: skip
    return specs


def tail_bytes(kind: str, specs: list[RecordSpec]) -> bytes:
    """What follows the valid records: nothing, or something reput must stop at (or wait behind)."""
    record = build_stream(specs[-1:], 1 << 20) if specs else build_stream([], 1 << 20)
    if kind == "truncated" and record:
        return record[: len(record) // 2]
    if kind == "garbage":
        return b"\x00\x00\x01\x00\x12\x34\x56\x78" + bytes(300)
    if kind == "zeros":
        return bytes(200)
    if kind == "bad_blank":
        return (4).to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
    if kind == "bad_lengths" and record:  # a complete record whose PROPERTIESLENGTH does not add up
        broken = bytearray(record)
        broken[-1 - len(specs[-1].properties.encode()) - 1] ^= 0x01
        return bytes(broken)
    if kind == "long_total" and record:  # TOTALSIZE 4 bytes longer than its fields (padding behind)
        total = int.from_bytes(record[:4], "big") + 4
        return total.to_bytes(4, "big") + record[4:] + bytes(4)
    if kind == "v6_truncated":
        return (200).to_bytes(4, "big") + MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True) + bytes(28) + (
            0x30).to_bytes(4, "big") + bytes(60)
    return b""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@contextmanager
def dispatch_log() -> Iterator[_Lines]:
    handler = _Lines()
    logger = logging.getLogger("ferrymq.store.dispatch")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def reput_both(native: MessageStore, pure: MessageStore, limit: int | None, log: _Lines) -> None:
    log.lines.clear()
    n_native = native.reput(limit)
    native_lines = list(log.lines)
    log.lines.clear()
    n_pure = pure.reput(limit)
    assert (n_native, native_lines) == (n_pure, log.lines), limit
    assert dispatch_state(native) == dispatch_state(pure)


def assert_same_output(native: MessageStore, pure: MessageStore) -> None:
    assert dispatch_state(native) == dispatch_state(pure)
    assert cq_state(native) == cq_state(pure)
    assert index_state(native) == index_state(pure)
    assert files_snapshot(native) == files_snapshot(pure)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=st.lists(raw_record_st, min_size=1, max_size=150),
    tail=st.sampled_from(TAILS),
    flip=st.one_of(st.none(), st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255))),
    cuts=st.lists(st.floats(0, 1), max_size=4),
    limits=st.lists(st.sampled_from([1, 2, 3, 7, 50, None]), min_size=1, max_size=3),
)
def test_replicated_stream_native_matches_pure(raw: list[tuple], tail: str,  # type: ignore[type-arg]
                                               flip: tuple[float, int] | None, cuts: list[float],
                                               limits: list[int | None]) -> None:
    require_extension()
    specs = to_specs(raw)
    stream = bytearray(build_stream(specs, SEGMENT_SIZE) + tail_bytes(tail, specs))
    if flip is not None:  # one damaged byte anywhere: a field, a length, a filler
        stream[int(flip[0] * len(stream))] ^= flip[1]
    bounds = sorted({0, len(stream), *(int(c * len(stream)) for c in cuts)})
    with stores_in_both_modes(mapped_file_size_commit_log=SEGMENT_SIZE) as (native, pure), dispatch_log() as log:
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            # a damaged record (and what follows it) is refused by the slave's check, alike in both modes
            accepted = [store.append_at(lo, bytes(stream[lo:hi])) for store in (native, pure)]
            assert accepted[0] == accepted[1]
            assert native.max_phy_offset == pure.max_phy_offset
            for limit in limits:
                reput_both(native, pure, limit, log)
            if not accepted[0]:
                break
        reput_both(native, pure, None, log)
        assert_same_output(native, pure)


put_st = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(PUT_TOPICS), st.integers(0, 3), st.sampled_from(SYS_FLAGS),
              properties_st),
    st.tuples(st.just("batch"), st.sampled_from(PUT_TOPICS), st.integers(0, 3),
              st.lists(properties_st, min_size=1, max_size=20)),
    st.tuples(st.just("reput"), st.sampled_from([1, 5, 100, None])),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(put_st, min_size=1, max_size=40), pending_max=st.sampled_from([100_000, 3]))
def test_puts_native_matches_pure(ops: list[tuple], pending_max: int) -> None:  # type: ignore[type-arg]
    """Master: the pure store dispatches the metas queued at put time (or parses, when they overflowed),
    the native store scans the bytes it wrote."""
    require_extension()
    with stores_in_both_modes(mapped_file_size_commit_log=SEGMENT_SIZE, dispatch_pending_max=pending_max) as (
            native, pure), dispatch_log() as log:  # fmt: skip
        for op in ops:
            if op[0] == "reput":
                reput_both(native, pure, op[1], log)
                continue
            results = []
            for store in (native, pure):
                if op[0] == "put":
                    _kind, topic, queue_id, sys_flag, props = op
                    msg = inner(topic=topic, queue_id=queue_id, sys_flag=sys_flag)
                    msg.properties_string = props
                    results.append(store.put_message(msg))
                else:
                    _kind, topic, queue_id, props_list = op
                    batch = [inner(topic=topic, queue_id=queue_id) for _ in props_list]
                    for msg, props in zip(batch, props_list, strict=True):
                        msg.properties_string = props
                    results.append(store.put_messages(batch))
            assert results[0] == results[1]
        reput_both(native, pure, None, log)
        assert_same_output(native, pure)
        assert not native.commit_log.pending  # the native store queues no metas
