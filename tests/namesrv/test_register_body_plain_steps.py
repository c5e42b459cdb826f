"""A plain REGISTER_BROKER body parsed in steps (common/register_body_codec.py, PlainRegisterBodyReader): the
entries come out exactly as one parse gives them, whatever the names and nested values hold, no step parses
much more than it was asked for, and a body outside the usual layout or a damaged one is read whole or
refused with ProtocolError."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrymq.common.register_body_codec import (
    PLAIN_TOPIC_BYTES_ESTIMATE,
    PlainRegisterBodyReader,
    decode_register_body,
    topic_config_from_json,
)
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError

#: characters that look like the structure the steps split on
TRICKY = st.text(alphabet=st.sampled_from(list('ab{}[],:" \\\n\t') + ["é", "\u2028"]), max_size=12)


def entry_json(name: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = TopicConfig(name, 4, 8, 6).to_json()
    if extra:
        obj.update(extra)
    return obj


def body(table: dict[str, Any], *, version: DataVersion = DataVersion(7, 9), filters: list[str] | None = None,
         indent: bool = False) -> bytes:
    obj = {"filterServerList": filters or [], "topicConfigSerializeWrapper": {
        "dataVersion": version.to_json(), "topicConfigTable": table}}
    if indent:
        return json.dumps(obj, indent=1, ensure_ascii=False).encode()
    return orjson.dumps(obj)


def read_all(reader: PlainRegisterBodyReader, step: int) -> list[TopicConfig]:
    out: list[TopicConfig] = []
    while batch := reader.read_topics(step):
        out.extend(batch)
    return out


def whole(raw: bytes) -> list[TopicConfig]:
    return list(decode_register_body(raw).topic_config_table.values())


def as_applied(topics: list[TopicConfig]) -> dict[str, TopicConfig]:
    """What the name server holds after applying them in order (a later entry of a name wins)."""
    return {tc.topic_name: tc for tc in topics}


def test_a_large_table_comes_out_in_steps_equal_to_one_parse() -> None:
    table = {f"estate-{i:05d}": entry_json(f"estate-{i:05d}") for i in range(3_000)}
    raw = body(table, filters=["10.0.0.9:7000"])
    reader = PlainRegisterBodyReader(raw)
    assert reader.stepped
    assert reader.data_version == DataVersion(7, 9)
    assert reader.filter_server_list == ["10.0.0.9:7000"]
    batches = []
    while batch := reader.read_topics(100):
        batches.append(batch)
    assert [tc for b in batches for tc in b] == whole(raw)
    assert len(batches) >= 3_000 // 200  # about 100 a step, never the whole table in one
    assert max(len(b) for b in batches) <= 200


def test_each_step_parses_about_what_it_was_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {f"t{i}": entry_json(f"t{i}", {"attributes": {"+k": "v"}}) for i in range(2_000)}
    raw = body(table)
    expected = whole(raw)
    parsed: list[int] = []
    real_loads = orjson.loads

    def loads(data: Any) -> Any:
        parsed.append(len(data))
        return real_loads(data)

    monkeypatch.setattr(orjson, "loads", loads)
    reader = PlainRegisterBodyReader(raw)
    assert read_all(reader, 50) == expected
    entry_bytes = len(raw) / len(table)
    assert max(parsed) < 3 * 50 * max(entry_bytes, PLAIN_TOPIC_BYTES_ESTIMATE) < len(raw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(TRICKY, min_size=0, max_size=40, unique=True),
       extras=st.lists(st.dictionaries(TRICKY, st.recursive(
           TRICKY | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.booleans(),
           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
           max_leaves=6), max_size=3), min_size=40, max_size=40),
       step=st.integers(min_value=1, max_value=7), indent=st.booleans())
def test_steps_equal_one_parse_whatever_the_names_and_nested_values(
        names: list[str], extras: list[dict[str, Any]], step: int, indent: bool) -> None:
    table = {name: entry_json(name, {"attributes": extras[i], "x": extras[-1 - i]}) for i, name in enumerate(names)}
    raw = body(table, indent=indent)
    reader = PlainRegisterBodyReader(raw)
    assert reader.stepped
    assert read_all(reader, step) == whole(raw)


@pytest.mark.parametrize("layout", ["table before version", "filters after wrapper", "bare wrapper",
                                    "key in a string first", "another object's table first",
                                    "table not an object"])
def test_other_layouts_are_read_whole_with_the_same_result(layout: str) -> None:
    table = {f"t{i}": entry_json(f"t{i}") for i in range(50)}
    version = DataVersion(3, 4).to_json()
    if layout == "table before version":
        raw = orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "topicConfigTable": table, "dataVersion": version}})
    elif layout == "filters after wrapper":
        raw = orjson.dumps({"topicConfigSerializeWrapper": {"dataVersion": version, "topicConfigTable": table},
                            "filterServerList": ["1.1.1.1:1"]})
    elif layout == "bare wrapper":
        raw = orjson.dumps({"dataVersion": version, "topicConfigTable": table})
    elif layout == "key in a string first":
        raw = orjson.dumps({"filterServerList": ['x"topicConfigTable":{'], "topicConfigSerializeWrapper": {
            "dataVersion": version, "topicConfigTable": table}})
    elif layout == "another object's table first":
        raw = orjson.dumps({"filterServerList": [], "aaa": {"topicConfigTable": {"fake": entry_json("fake")}},
                            "topicConfigSerializeWrapper": {"dataVersion": version, "topicConfigTable": table}})
    else:
        raw = orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": version, "topicConfigTable": None}})
        table = {}
    reader = PlainRegisterBodyReader(raw)
    if layout != "key in a string first":
        assert not reader.stepped
    expected = decode_register_body(raw)
    assert read_all(reader, 7) == list(expected.topic_config_table.values())
    assert reader.data_version == expected.data_version
    assert reader.filter_server_list == expected.filter_server_list
    assert len(expected.topic_config_table) == len(table)


def test_what_follows_the_table_is_read_by_the_last_step() -> None:
    raw = orjson.dumps({"filterServerList": ["a:1"], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 2, "timestamp": 3},
        "topicConfigTable": {f"t{i}": entry_json(f"t{i}") for i in range(500)},
        "topicQueueMappingInfoMap": {"t1": {"bname": "b", "epoch": 1}}}})
    reader = PlainRegisterBodyReader(raw)
    assert reader.stepped
    assert read_all(reader, 40) == whole(raw)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000), flip=st.integers(min_value=0, max_value=10_000),
       byte=st.integers(min_value=0, max_value=255), step=st.integers(min_value=1, max_value=9))
def test_a_damaged_body_is_read_or_refused_never_anything_else(cut: int, flip: int, byte: int, step: int) -> None:
    raw = bytearray(body({f"t{i}": entry_json(f"t{i}", {"attributes": {"a": "}"}}) for i in range(60)}))
    raw[flip % len(raw)] = byte
    damaged = bytes(raw[: len(raw) - cut % len(raw)])
    try:
        reader = PlainRegisterBodyReader(damaged)
        got = read_all(reader, step)
    except ProtocolError:
        return
    try:  # what the steps accepted, one parse accepts with the same entries
        assert as_applied(got) == as_applied(whole(damaged))
    except ProtocolError:
        pytest.fail("steps accepted a body one parse refuses")


def test_a_malformed_entry_is_refused() -> None:
    raw = body({"good": entry_json("good"), "bad": {"readQueueNums": "many"}})
    with pytest.raises(ProtocolError):
        read_all(PlainRegisterBodyReader(raw), 1)
    assert topic_config_from_json("good", entry_json("good")).read_queue_nums == 4
