"""common/records.py: the C walk of PULL bodies against its pure-Python reference, on generated records
(hypothesis), slow records (IPv6 hosts, compressed bodies) and damaged bodies."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.common import records
from ferrymq.common.message import (
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    MessageExtBrokerInner,
    host_to_bytes,
    properties_to_string,
)
from ferrymq.common.message_codec import RecordFormatError, encode_record

STORE_HOST = host_to_bytes("10.0.0.7", 10911)


def _record(qoff: int, body: bytes, topic: str, props: dict[str, str], sys_flag: int = 0) -> bytes:
    inner = MessageExtBrokerInner(topic=topic, queue_id=qoff % 7, body=body,
                                  properties_string=properties_to_string(props), sys_flag=sys_flag,
                                  born_timestamp=1_700_000_000_000 + qoff, store_host=STORE_HOST)
    return encode_record(inner, queue_offset=qoff, phy_offset=5_000 + qoff * 300,
                         store_timestamp=1_700_000_000_500 + qoff)


def _both(raw: bytes, base: int, start: int, end: int) -> records.PullScan | None:
    expected = records._scan_python(raw, base, start, end)
    ext = records.EXTENSION
    assert ext is not None, "the C extension is built when the package is installed"
    got = ext.scan_pull_body(raw, base, start, end)
    assert (None if got is None else records.PullScan(*got)) == expected
    return expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.sampled_from(["T", "Orders", "a" * 100]),
                          st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "x"]),
                                          st.text(min_size=1, max_size=20).filter(lambda s: "\x01" not in s
                                                                                  and "\x02" not in s),
                                          max_size=3)), max_size=12),
       st.integers(0, 1 << 40), st.integers(0, 12), st.integers(0, 12))
def test_native_walk_equals_the_reference(items: list[tuple[bytes, str, dict[str, str]]], base: int, start: int,
                                          end: int) -> None:
    raw = b"".join(_record(i, body, topic, props) for i, (body, topic, props) in enumerate(items))
    scan = _both(raw, base, start, end)
    assert scan is not None and scan.records == len(items)
    offsets = struct.unpack(f"={len(items)}q", scan.queue_offsets)
    assert list(offsets) == list(range(len(items)))
    assert list(scan.keep) == [1 if start <= i < end else 0 for i in range(len(items))]
    segs = struct.unpack(f"={6 * len(items)}q", scan.segs)
    for i, (body, _topic, _props) in enumerate(items):
        assert raw[segs[6 * i + 1] - base:segs[6 * i + 2] - base] == body


@pytest.mark.parametrize("flag", [SYSFLAG_BORNHOST_V6, SYSFLAG_COMPRESSED])
def test_slow_records_hand_over_to_the_row_decoder(flag: int) -> None:
    raw = _record(0, b"a", "T", {}) + _record(1, b"b", "T", {}, sys_flag=flag if flag != SYSFLAG_BORNHOST_V6 else 0)
    if flag == SYSFLAG_BORNHOST_V6:  # set the flag in the second record's SYSFLAG field (offset 36)
        second = len(_record(0, b"a", "T", {}))
        sys_flag = struct.unpack_from(">i", raw, second + 36)[0] | flag
        raw = raw[:second + 36] + struct.pack(">i", sys_flag) + raw[second + 40:]
    assert _both(raw, 0, 0, 10) is None


def test_damaged_bodies_raise_naming_the_position() -> None:
    good = _record(0, b"hello", "T", {"TAGS": "a"}) + _record(1, b"world", "T", {})
    cases = {
        "truncated record header": good[:len(good) - 5][: len(_record(0, b"hello", "T", {"TAGS": "a"})) + 40],
        "bad record": good[:4] + b"\x00\x00\x00\x00" + good[8:],
        "does not match its fields": good[:84] + struct.pack(">i", 10_000) + good[88:],
    }
    for needle, raw in cases.items():
        for walk in (records._scan_python, records.EXTENSION.scan_pull_body if records.EXTENSION else None):
            assert walk is not None
            with pytest.raises((RecordFormatError, ValueError), match=needle):
                walk(raw, 0, 0, 10)
        with pytest.raises(RecordFormatError, match=needle):
            records.scan_pull_body(raw, 0, 0, 10)
    assert _both(b"", 0, 0, 1) == records.PullScan(0, b"", b"", b"", b"", b"", b"", b"", b"", 0)


def _raw_props_record(props: bytes) -> bytes:
    """A record whose properties text is ``props`` verbatim (duplicates and junk included)."""
    inner = MessageExtBrokerInner(topic="T", queue_id=0, body=b"b", properties_string="", born_timestamp=1,
                                  store_host=STORE_HOST)
    rec = encode_record(inner, queue_offset=0, phy_offset=0, store_timestamp=2)
    # the record ends with PROPERTIESLENGTH (2 bytes) and the (empty) properties: splice in the text
    head = rec[:-2]
    out = head + struct.pack(">h", len(props)) + props
    return struct.pack(">i", len(out)) + out[4:]


@pytest.mark.parametrize(("props", "repeated"), [
    (b"", 0),
    (b"TAGS\x01a\x02KEYS\x01b", 0),
    (b"TAGS\x01a\x02TAGS\x01b", 1),
    (b"A\x01x\x02B\x01y\x02A\x01z\x02", 1),
    (b"\x01a\x02\x01b", 0),  # nameless items are dropped, not names
    (b"junk\x02junk\x02K\x01v", 0),  # items without 0x01 are dropped
    (b"K\x01v\x02K", 0),
    (b"K\x01v\x02K\x01", 1),  # an empty value still names K
    (b"AB\x01v\x02A\x01w\x02ABC\x01u", 0),  # prefixes are other names
])
def test_repeated_property_names_are_flagged(props: bytes, repeated: int) -> None:
    raw = _record(0, b"x", "T", {"TAGS": "t"}) + _raw_props_record(props) + _record(2, b"y", "T", {})
    scan = _both(raw, 0, 0, 10)
    assert scan is not None and scan.repeated == repeated
