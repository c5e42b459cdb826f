"""Direct tests of the C extension's functions (ferrymq.store._speedups, through ferrymq.store.speedups) and
of the store methods that use them, against the pure-Python reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dispatch_streams import MIN_HASH_KEY, RecordSpec, encode_spec, require_extension, widen_hosts
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.common.message_codec import BLANK_MAGIC_CODE, blank_filler
from ferrymq.store import speedups
from ferrymq.store.consume_queue import UNIT, ConsumeQueue
from ferrymq.store.index import IndexFile, build_key, index_file_size, java_hash_fast, key_hash

START_TS = 1_700_000_000_000
INT_MAX = 0x7FFFFFFF
REPO_SRC = str(Path(__file__).resolve().parents[2] / "src")


def record(topic: str = "TopicA", queue_id: int = 0, queue_offset: int = 0, props: str = "", sys_flag: int = 0,
           ts: int = START_TS, phy: int = 0, wrong_phy: bool = False) -> bytes:
    spec = RecordSpec(topic, queue_id, queue_offset, sys_flag, props, b"body", ts, wrong_phy_field=wrong_phy)
    return encode_spec(spec, phy)


def scan(buf: bytes, pos: int = 0, end: int | None = None, max_records: int = 10_000, base: int = 0,
         want_index: bool = True) -> tuple:  # type: ignore[type-arg]
    ext = require_extension()
    return ext.scan_dispatch(buf, pos, len(buf) if end is None else end, max_records, base, want_index)  # type: ignore[attr-defined]


def stream(*records: bytes) -> tuple[bytes, list[int]]:
    """Concatenated records and each one's position."""
    positions = []
    out = b""
    for r in records:
        positions.append(len(out))
        out += r
    return out, positions


def index_entries(entries: bytes) -> list[tuple[int, int, int]]:
    """(key_hash, phy_offset, store_timestamp) of packed scan index entries."""
    return [(h, phy, ts) for phy, ts, h in speedups.SCAN_INDEX_ENTRY.iter_unpack(entries)]


def py_key_hash(topic: str, key: str) -> int:
    return key_hash(build_key(topic, key))


# --- loader ---------------------------------------------------------------------------------------


def test_extension_is_built_under_ci() -> None:
    """CI builds the extension (pip install -e .): a missing build fails there instead of skipping."""
    ext = require_extension()
    assert ext.SCAN_INDEX_ENTRY_SIZE == speedups.SCAN_INDEX_ENTRY.size  # type: ignore[attr-defined]


@pytest.mark.parametrize(("value", "expect_native"), [("1", False), ("", True), ("0", True)])
def test_pure_python_environment_switch(value: str, expect_native: bool) -> None:
    require_extension()
    env = {**os.environ, "PYTHONPATH": REPO_SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env[speedups.PURE_PYTHON_ENV] = value
    code = "from ferrymq.store import speedups; print(speedups.NATIVE is not None, speedups.EXTENSION is not None)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(expect_native), "True"]


# --- scan_dispatch: consume queue runs --------------------------------------------------------------


def test_scan_groups_units_per_queue_in_order() -> None:
    buf, pos = stream(
        record(queue_id=0, queue_offset=0, props="TAGS\x01a"),
        record(queue_id=1, queue_offset=5, props="TAGS\x01b", wrong_phy=True),
        record(queue_id=0, queue_offset=1),
        record(topic="TopicB", queue_id=0, queue_offset=9),
        record(queue_id=1, queue_offset=6, ts=START_TS + 5),
        record(queue_id=0, queue_offset=2, props="TAGS\x01a"),
    )
    base = 1 << 30
    records, end_pos, last_ts, stop, runs, _entries = scan(buf, base=base)
    assert (records, end_pos, last_ts, stop) == (6, len(buf), START_TS, speedups.SCAN_STOP_END)
    sizes = [b - a for a, b in zip(pos, [*pos[1:], len(buf)], strict=True)]

    def units(*idx_tags: tuple[int, str]) -> bytes:
        return b"".join(UNIT.pack(base + pos[i], sizes[i], java_hash_fast(t) if t else 0) for i, t in idx_tags)

    assert runs == [
        ("TopicA", 0, 0, units((0, "a"), (2, ""), (5, "a"))),
        ("TopicA", 1, 5, units((1, "b"), (4, ""))),
        ("TopicB", 0, 9, units((3, ""))),
    ]


def test_scan_splits_a_queue_where_offsets_do_not_continue() -> None:
    buf, _pos = stream(*(record(queue_offset=qo) for qo in (0, 1, 5, 6, 6, 2)))
    runs = scan(buf)[4]
    assert [(first, len(units) // UNIT.size) for _t, _q, first, units in runs] == [(0, 2), (5, 2), (6, 1), (2, 1)]


def test_scan_limits_and_arguments() -> None:
    buf, pos = stream(*(record(queue_offset=qo, ts=START_TS + qo) for qo in range(5)))
    assert scan(buf, max_records=2)[:4] == (2, pos[2], START_TS + 1, speedups.SCAN_STOP_LIMIT)
    assert scan(buf, pos=pos[2])[:4] == (3, len(buf), START_TS + 4, speedups.SCAN_STOP_END)
    assert scan(buf, max_records=0)[:4] == (0, 0, 0, speedups.SCAN_STOP_LIMIT)
    assert scan(buf, pos=len(buf))[:4] == (0, len(buf), 0, speedups.SCAN_STOP_END)
    assert scan(buf, pos=pos[1], end=pos[1] - 1)[:4] == (0, pos[1], 0, speedups.SCAN_STOP_RECORD)
    assert scan(buf, end=pos[3] + 10)[:4] == (3, pos[3], START_TS + 2, speedups.SCAN_STOP_RECORD)  # incomplete
    with pytest.raises(ValueError):
        scan(buf, end=len(buf) + 1)
    with pytest.raises(ValueError):
        scan(buf, pos=-1)


def test_scan_stops_when_a_window_holds_too_many_queues() -> None:
    ext = require_extension()
    groups_max = ext.SCAN_GROUPS_MAX  # type: ignore[attr-defined]
    buf, pos = stream(*(record(queue_id=q) for q in range(groups_max + 10)))
    records, end_pos, _ts, stop, runs, _e = scan(buf)
    assert (records, end_pos, stop, len(runs)) == (groups_max, pos[groups_max], speedups.SCAN_STOP_GROUPS,
                                                   groups_max)
    assert scan(buf, pos=end_pos)[:4:3] == (10, speedups.SCAN_STOP_END)


# --- scan_dispatch: what it leaves to Python ---------------------------------------------------------


def _patched(r: bytes, offset: int, value: int, size: int = 4) -> bytes:
    return r[:offset] + value.to_bytes(size, "big", signed=True) + r[offset + size :]


def _long_total(r: bytes) -> bytes:
    return _patched(r, 0, len(r) + 4) + bytes(4)


PLAIN = record()
LEFT_TO_PYTHON = {
    "schedule topic": record(topic="SCHEDULE_TOPIC_XXXX", props="DELAY\x013"),
    "prepared": record(sys_flag=0x4),
    "rollback": record(sys_flag=0xC),
    "ipv6 born host": widen_hosts(PLAIN, True, False),
    "ipv6 store host": widen_hosts(PLAIN, False, True),
    "non-ascii topic": record(topic="Tópico"),
    "non-ascii properties": record(props="KEYS\x01schlüssel"),
    "non-ascii other property": record(props="OTHER\x01é\x02TAGS\x01a"),
    "slash topic": record(topic="a/b"),
    "dot topic": record(topic="."),
    "dotdot topic": record(topic=".."),
    "nul topic": record(topic="T\x00x"),
    "negative queue offset": _patched(PLAIN, 20, -1, 8),
    "huge queue offset": _patched(PLAIN, 20, 1 << 60, 8),
    "bad magic": _patched(PLAIN, 4, 0x12345678),
    "v2 magic": _patched(PLAIN, 4, -626843477),
    "total below minimum": _patched(PLAIN, 0, 90),
    "total longer than fields": _long_total(PLAIN),
    "total shorter than fields": _patched(PLAIN, 0, len(PLAIN) - 1)[:-1],
    "negative body length": _patched(PLAIN, 84, -1),
    "body length past the record": _patched(PLAIN, 84, 1000),
    "topic length above 127": PLAIN[:92] + b"\x80" + PLAIN[93:],
    "negative properties length": _patched(record(props="ab"), len(record(props="ab")) - 4, -1, 2),
    "blank filler": blank_filler(len(PLAIN)) + bytes(len(PLAIN) - 8),
    "short blank filler": (4).to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True),
    "zeros": bytes(len(PLAIN)),
}


@pytest.mark.parametrize("kind", sorted(LEFT_TO_PYTHON))
def test_scan_leaves_other_records_to_python(kind: str) -> None:
    good = record(queue_offset=0)
    buf = good + LEFT_TO_PYTHON[kind] + record(queue_offset=1)
    records, end_pos, _ts, stop, runs, _e = scan(buf)
    assert (records, end_pos, stop) == (1, len(good), speedups.SCAN_STOP_RECORD)
    assert len(runs) == 1


def test_scan_takes_commit_flag_and_other_sys_flags() -> None:
    buf, _pos = stream(record(sys_flag=0x8), record(queue_offset=1, sys_flag=0x3))
    assert scan(buf)[:4:3] == (2, speedups.SCAN_STOP_END)


# --- scan_dispatch: properties and index keys -------------------------------------------------------

PROPERTY_CASES = [
    # (properties, TAGS value the Python lookup finds, index keys in order)
    ("", None, []),
    ("TAGS\x01a\x02TAGS\x01b", "b", []),
    ("TAGS\x01a\x02TAGS\x01", "", []),
    ("XTAGS\x01a", None, []),
    ("x\x02TAGS\x01b", "b", []),
    ("\x02TAGS\x01t\x02", "t", []),
    ("TAGS\x01x\x01y", "x\x01y", []),
    ("TAGS", None, []),
    ("KEYS\x01 a  b \x02UNIQ_KEY\x01u", None, ["u", "a", "b"]),
    ("UNIQ_KEY\x01\x02KEYS\x01k", None, ["k"]),
    ("KEYS\x01k1\x02KEYS\x01k2 k3", None, ["k2", "k3"]),
    ("KEYS\x01\x02UNIQ_KEY\x01u1\x02UNIQ_KEY\x01u2", None, ["u2"]),
    ("KEYS\x01   ", None, []),
    ("AKEYS\x01k\x02UNIQ_KEYX\x01u", None, []),
    ("WAIT\x01true\x02TAGS\x01TagA\x02UNIQ_KEY\x017F00000100002A9F", "TagA", ["7F00000100002A9F"]),
    (f"KEYS\x01{MIN_HASH_KEY} {'k' * 600}", None, [MIN_HASH_KEY, "k" * 600]),
]


@pytest.mark.parametrize(("props", "tags", "keys"), PROPERTY_CASES)
def test_scan_property_lookup_matches_python(props: str, tags: str | None, keys: list[str]) -> None:
    from ferrymq.store.dispatch import PROPERTY_TAGS, get_property, index_keys_of

    assert get_property(props, PROPERTY_TAGS) == tags
    assert (index_keys_of(props) if props else []) == keys
    buf = record(props=props, ts=START_TS + 7)
    _n, _end, _ts, _stop, runs, entries = scan(buf, base=4096)
    (_topic, _qid, _first, units), = runs
    assert UNIT.unpack(units) == (4096, len(buf), java_hash_fast(tags) if tags else 0)
    assert index_entries(entries) == [(py_key_hash("TopicA", k), 4096, START_TS + 7) for k in keys]
    assert scan(buf, want_index=False)[5] == b""


def test_scan_key_hash_of_integer_min_value_is_zero() -> None:
    from ferrymq.common.message import java_string_hash

    assert java_string_hash(f"TopicA#{MIN_HASH_KEY}") == -(1 << 31)
    assert py_key_hash("TopicA", MIN_HASH_KEY) == 0
    entries = scan(record(props=f"UNIQ_KEY\x01{MIN_HASH_KEY}"))[5]
    assert index_entries(entries) == [(0, 0, START_TS)]


@settings(max_examples=200, deadline=None)
@given(topic=st.text(alphabet="abcXYZ%_-09", min_size=1, max_size=127),
       key=st.text(alphabet="".join(map(chr, range(0x20, 0x7F))), min_size=1, max_size=700))
def test_scan_key_and_tags_hashes_match_python(topic: str, key: str) -> None:
    key = key.replace(" ", "_")
    tags = key[:40]
    buf = record(topic=topic, props=f"TAGS\x01{tags}\x02KEYS\x01{key}")
    _n, _end, _ts, _stop, runs, entries = scan(buf)
    assert UNIT.unpack(runs[0][3])[2] == java_hash_fast(tags)
    assert index_entries(entries) == [(py_key_hash(topic, key), 0, START_TS)]


# --- index_put_many --------------------------------------------------------------------------------

entry_st = st.tuples(
    st.one_of(st.integers(0, INT_MAX), st.sampled_from([0, 1, 7, INT_MAX])),
    st.integers(0, 1 << 40),
    st.one_of(st.integers(START_TS - 10_000, START_TS + 100_000), st.sampled_from([-(1 << 63), (1 << 63) - 1])),
)


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(entry_st, max_size=40), slot_num=st.integers(1, 9), index_num=st.integers(1, 30),
       chunks=st.lists(st.integers(0, 40), max_size=4), garbage=st.lists(st.integers(-3, 40), max_size=9))
def test_index_put_many_matches_put_hashed_many(entries: list[tuple[int, int, int]], slot_num: int,
                                                index_num: int, chunks: list[int], garbage: list[int]) -> None:
    """Same file bytes, counters and return values, from a fresh or a garbage-slotted file, in chunks."""
    ext = require_extension()
    import tempfile

    packed = b"".join(speedups.SCAN_INDEX_ENTRY.pack(phy, ts, h) for h, phy, ts in entries)
    with tempfile.TemporaryDirectory() as tmp:
        files = [IndexFile(os.path.join(tmp, name), slot_num, index_num) for name in ("py", "c")]
        for f in files:
            for i, v in enumerate(garbage[:slot_num]):  # stale slot links (e.g. after a crash)
                f.mf.mm[40 + 4 * i : 44 + 4 * i] = v.to_bytes(4, "big", signed=True)
        starts = sorted({0, *(min(c, len(entries)) for c in chunks)})
        for start in starts:
            got_py = files[0].put_hashed_many(entries, start)
            got_c = files[1].put_packed(ext, packed, start)  # type: ignore[arg-type]
            assert got_py == got_c
        py, c = files
        assert (py.index_count, py.hash_slot_count, py.begin_timestamp, py.begin_phy_offset, py.end_phy_offset,
                py.end_timestamp, py.dirty) == (c.index_count, c.hash_slot_count, c.begin_timestamp,
                                                c.begin_phy_offset, c.end_phy_offset, c.end_timestamp, c.dirty)
        assert bytes(py.mf.mm) == bytes(c.mf.mm)
        for f in files:
            f.close()


def test_index_put_many_rejects_bad_arguments(tmp_path: Path) -> None:
    ext = require_extension()
    size = index_file_size(4, 4)
    ok_entry = speedups.SCAN_INDEX_ENTRY.pack(1, START_TS, 5)
    put = ext.index_put_many  # type: ignore[attr-defined]
    with pytest.raises(ValueError):  # smaller than the geometry
        put(bytearray(size - 1), ok_entry, 0, 4, 4, 1, 0, 0, 0)
    with pytest.raises(ValueError):  # a hash no key_hash produces
        put(bytearray(size), speedups.SCAN_INDEX_ENTRY.pack(1, START_TS, INT_MAX + 1), 0, 4, 4, 1, 0, 0, 0)
    with pytest.raises(ValueError):  # entries not a whole number of records
        put(bytearray(size), ok_entry[:-1], 0, 4, 4, 1, 0, 0, 0)
    with pytest.raises(ValueError):
        put(bytearray(size), ok_entry, 2, 4, 4, 1, 0, 0, 0)
    with pytest.raises(ValueError):
        put(bytearray(size), ok_entry, 0, 0, 4, 1, 0, 0, 0)
    with pytest.raises((TypeError, BufferError)):  # read-only file buffer
        put(bytes(size), ok_entry, 0, 4, 4, 1, 0, 0, 0)
    assert put(bytearray(size), ok_entry, 0, 4, 4, 4, 0, 0, 0)[0] == 0  # full file: nothing put


# --- ConsumeQueue.put_units_packed -------------------------------------------------------------------

UNITS_PER_FILE = 7


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(-3, 12), st.integers(1, 20)), min_size=1, max_size=8),
       first=st.integers(0, 30))
def test_put_units_packed_matches_put_unit(runs: list[tuple[int, int]], first: int) -> None:
    """Runs that continue the queue, leave gaps, overlap written units or cross files: same files as
    put_unit one unit at a time."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        queues = [ConsumeQueue(os.path.join(tmp, name), "T", 0, UNITS_PER_FILE * UNIT.size) for name in ("a", "b")]
        next_qo = first
        phy = 1000
        for step, n in runs:
            start_qo = max(0, next_qo + step)
            units = [(phy + 100 * i, 90 + i, i - 3) for i in range(n)]
            phy += 100 * n
            wrote_ref = False
            for i, (p, size, tags) in enumerate(units):
                wrote_ref |= queues[0].put_unit(p, size, tags, start_qo + i)
            packed = b"".join(UNIT.pack(*u) for u in units)
            assert queues[1].put_units_packed(start_qo, packed) == wrote_ref
            next_qo = start_qo + n
        ref, got = queues
        assert (ref.max_phy_end, ref.min_logic_offset, ref.mfq.max_offset) == (
            got.max_phy_end, got.min_logic_offset, got.mfq.max_offset)
        assert [(f.file_from_offset, f.wrote_position, bytes(f.mm)) for f in ref.mfq.files] == [
            (f.file_from_offset, f.wrote_position, bytes(f.mm)) for f in got.mfq.files]
        for q in queues:
            q.close()
