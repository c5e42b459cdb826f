"""``Producer.send_batch`` encoding: the column-wise encoder writes exactly the bytes of the message-by-message
one (UNIQ_KEYs made deterministic), raises the same errors, and makes well-formed, unique UNIQ_KEYs."""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.client import producer as producer_mod
from ferrymq.client.producer import Producer, new_uniq_key, new_uniq_keys
from ferrymq.common.message import (
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    Message,
    properties_to_string,
)
from ferrymq.common.message_codec import (
    RecordFormatError,
    decode_batch_body,
    encode_batch_body,
    encode_batch_columns,
    encode_batch_shared_properties,
)
from ferrymq.errors import ClientError

UNIQ = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_KEY = re.compile(r"[0-9A-F]{32}")


def reference_encode(p: Producer, msgs: list[Message], topic: str) -> tuple[bytes, str]:
    """What ``send_batch`` did before the column-wise encoder (checks, UNIQ_KEYs, body)."""
    p._check_batch(msgs, topic)
    uniqs = [p._ensure_uniq_key(m) for m in msgs]
    body = encode_batch_body((m.flag, m.body, properties_to_string(m.properties)) for m in msgs)
    return body, ",".join(uniqs)


def fake_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key maker draws from one deterministic sequence (so the old and new paths make the same keys)."""
    counter = itertools.count()

    def block(n: int, ip: str = "") -> tuple[str, str]:
        return "P" * 28, "".join(f"{next(counter) & 0xFFFF:04X}" for _ in range(n))

    monkeypatch.setattr(producer_mod, "new_uniq_key", lambda ip="": "P" * 28 + f"{next(counter) & 0xFFFF:04X}")
    monkeypatch.setattr(producer_mod, "_uniq_key_block", block)


def run_both(msgs: list[Message], topic: str) -> tuple[Any, Any, Any, Any]:
    """(old outcome, new outcome, old messages after, new messages after); an outcome is the result or the
    exception's (type, text). The copies keep the input's sharing of property dicts and messages."""
    old_msgs, new_msgs = copy.deepcopy(msgs), copy.deepcopy(msgs)
    outcomes = []
    for batch, fn in ((old_msgs, reference_encode), (new_msgs, None)):
        with pytest.MonkeyPatch.context() as m:
            fake_keys(m)  # a fresh sequence for each path
            p = Producer("127.0.0.1:9876", "g", max_message_size_bytes=64)
            try:
                out: Any = fn(p, batch, topic) if fn else p._encode_batch(batch, topic)
            except (ClientError, RecordFormatError, TypeError) as exc:
                out = (type(exc), str(exc))
            outcomes.append(out)
    return outcomes[0], outcomes[1], old_msgs, new_msgs


texts = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                min_size=0, max_size=6)
prop_dicts = st.dictionaries(
    st.sampled_from(["TAGS", "KEYS", "a", "é", UNIQ, "DELAY", "x"]) | texts.filter(bool),
    texts | st.none() | st.integers(0, 9), max_size=4)
bodies = st.binary(min_size=0, max_size=80)


@st.composite
def batches(draw: Any) -> tuple[list[Message], str]:
    topic = draw(st.sampled_from(["T", "T2", "%RETRY%g", "bad topic!"]))
    n = draw(st.integers(1, 8))
    msgs = []
    for _ in range(n):
        t = topic if draw(st.integers(0, 9)) else draw(st.sampled_from(["T", "T2"]))
        msgs.append(Message(t, draw(bodies), draw(st.integers(-5, 1 << 20)), draw(prop_dicts)))
    if draw(st.booleans()):  # the usual batch: equal properties (same or other key order) in distinct dicts
        shared = draw(prop_dicts)
        for m in msgs:
            items = list(shared.items())
            if draw(st.integers(0, 7)) == 0:
                items.reverse()
            m.properties = dict(items)
        if draw(st.booleans()):
            size = draw(st.integers(1, 80))
            for m in msgs:
                m.body = b"b" * size
            if draw(st.booleans()):
                for m in msgs:
                    m.flag = 3
    if n > 1 and draw(st.booleans()):  # aliasing: a shared properties dict, or one message twice
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if draw(st.booleans()):
            msgs[j].properties = msgs[i].properties
        else:
            msgs[j] = msgs[i]
    return msgs, topic


@settings(max_examples=400, deadline=None)
@given(batches())
def test_column_encoder_matches_message_by_message(case: tuple[list[Message], str]) -> None:
    msgs, topic = case
    old, new, old_msgs, new_msgs = run_both(msgs, topic)
    assert new == old
    assert [m.properties for m in new_msgs] == [m.properties for m in old_msgs]
    assert [list(m.properties) for m in new_msgs] == [list(m.properties) for m in old_msgs]  # same order


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-(1 << 31), (1 << 31) - 1), st.binary(max_size=50)), max_size=10),
       st.binary(max_size=40), st.integers(0, 6))
def test_encode_batch_shared_properties_matches(entries: list[tuple[int, bytes]], head: bytes, k: int) -> None:
    tails = bytes(range(65, 65 + k)) * len(entries)
    slices = [slice(i * k, i * k + k) for i in range(len(entries))]
    expected = encode_batch_body((f, b, (head + tails[sl]).decode("latin-1")) for (f, b), sl in
                                 zip(entries, slices, strict=True)) if head.isascii() else None
    got = encode_batch_shared_properties([f for f, _ in entries], [b for _, b in entries],
                                         [len(b) for _, b in entries], head, tails, slices)
    assert decode_batch_body(got) == [(f, b, (head + tails[sl]).decode("utf-8", "replace"))
                                      for (f, b), sl in zip(entries, slices, strict=True)]
    if expected is not None:
        assert got == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-(1 << 31), (1 << 31) - 1), st.binary(max_size=50),
                          st.text(max_size=20)), max_size=10))
def test_encode_batch_columns_matches_encode_batch_body(entries: list[tuple[int, bytes, str]]) -> None:
    expected = encode_batch_body(entries)
    got = encode_batch_columns((f for f, _, _ in entries), [b for _, b, _ in entries],
                               [p.encode() for _, _, p in entries])
    assert got == expected


def test_encode_batch_columns_rejects_long_properties() -> None:
    with pytest.raises(RecordFormatError):
        encode_batch_columns([0], [b"x"], [b"p" * 32768])
    assert encode_batch_columns([], [], []) == b""


@pytest.mark.parametrize("props", [{"TAGS": "bench"}, {}, {"KEYS": "k1 k2", "TAGS": "t"}, {"a": "é"}])
@pytest.mark.parametrize("sizes", [[10] * 300, [10, 1000] * 150, [1024] * 2])
def test_fast_paths_set_keys_like_send(props: dict[str, str], sizes: list[int]) -> None:
    p = Producer("127.0.0.1:9876", "g")
    for shared in (True, False):
        msgs = [Message("T", b"b" * size, i % 2 if shared else 0, dict(props) if shared or i else {"z": "1"})
                for i, size in enumerate(sizes)]
        body, uniq = p._encode_batch(msgs, "T")
        keys = uniq.split(",")
        assert keys == [m.properties[UNIQ] for m in msgs]
        assert len(set(keys)) == len(msgs) and all(_KEY.fullmatch(k) for k in keys)
        assert all(list(m.properties)[-1] == UNIQ for m in msgs)
        assert body == encode_batch_body((m.flag, m.body, properties_to_string(m.properties)) for m in msgs)


def test_new_uniq_keys_shape() -> None:
    single = new_uniq_key()
    for n in (0, 1, 2, 256, 4096, 4097):
        keys = new_uniq_keys(n)
        assert len(keys) == n
        assert len(set(keys)) == n
        assert all(_KEY.fullmatch(k) and k[:20] == single[:20] for k in keys)
    keys = new_uniq_keys(300)
    counters = [int(k[28:], 16) for k in keys]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(counters, counters[1:], strict=False))
    assert len({k[20:28] for k in keys}) == 1  # one clock read (ms since month start)
    after = new_uniq_key()
    assert (int(after[28:], 16) - counters[-1]) & 0xFFFF == 1


def test_new_uniq_keys_reads_the_clock_once_per_block_of_4096() -> None:
    """A Spark batch of 10 000 rows takes 3 blocks, not 10 000 single keys (each reading the clock)."""
    keys = new_uniq_keys(10_000)
    assert len(set(keys)) == 10_000 and all(_KEY.fullmatch(k) for k in keys)
    counters = [int(k[28:], 16) for k in keys]
    assert all((b - a) & 0xFFFF == 1 for a, b in zip(counters, counters[1:], strict=False))
    for block in (keys[:4096], keys[4096:8192], keys[8192:]):
        assert len({k[20:28] for k in block}) == 1


def test_batch_checks_still_raise() -> None:
    p = Producer("127.0.0.1:9876", "g")
    with pytest.raises(ClientError, match="same topic"):
        p._encode_batch([Message("T", b"a"), Message("U", b"b")], "T")
    with pytest.raises(ClientError, match="empty"):
        p._encode_batch([Message("T", b"a"), Message("T", b"")], "T")
    with pytest.raises(ClientError, match="delayed"):
        p._encode_batch([Message("T", b"a", 0, {"DELAY": "3"})], "T")
    with pytest.raises(ClientError, match="empty"):
        p._encode_batch([Message("T", None)], "T")  # type: ignore[arg-type]
