"""Option parsing: every bad or conflicting option fails with a message naming it."""

from __future__ import annotations

import pytest

from ferrymq.errors import ConfigError
from ferrymq.spark.options import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    EARLIEST,
    LATEST,
    parse_duration_ms,
    parse_sink_options,
    parse_source_options,
    parse_sub_expression,
)

pytestmark = pytest.mark.spark

NS = {"nameServer": "127.0.0.1:9876"}


def src(streaming: bool = False, **kw: str):
    return parse_source_options({**NS, **kw}, streaming=streaming)


def test_defaults_batch_and_stream() -> None:
    batch = src(subscribe="A, B,A")
    assert batch.topics == ("A", "B")
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"
    assert (
        batch.fail_on_data_loss and batch.read_from_slave == "whenMasterDown" and batch.sub_expression == "*"
    )
    stream = src(True, subscribe="A")
    assert stream.starting.kind == "latest"
    assert stream.max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS


def test_options_are_case_insensitive_and_typed() -> None:
    o = parse_source_options(
        {"NAMESERVER": "h:1", "Subscribe": "T", "pullbatchsize": "64", "FAILONDATALOSS": "false",
         "readfromslave": "PREFER", "minPartitions": "5", "subExpression": "a || b"},
        streaming=False,
    )  # fmt: skip
    assert o.name_server == "h:1" and o.pull_batch_size == 64 and not o.fail_on_data_loss
    assert o.read_from_slave == "prefer" and o.min_partitions == 5
    assert o.tag_set == frozenset({"a", "b"})


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"subscribe": "T"}, False, "nameServer"),
        ({**NS}, False, "subscribe"),
        ({**NS, "subscribe": "T", "subscribePattern": "T.*"}, False, "subscribe"),
        ({**NS, "subscribe": "T", "topic": "T"}, False, "topic"),
        ({**NS, "subscribePattern": "(["}, False, "subscribePattern"),
        ({**NS, "assign": "{bad"}, False, "assign"),
        ({**NS, "assign": '{"T": []}'}, False, "assign"),
        ({**NS, "assign": '{"T": ["noqueue"]}'}, False, "assign"),
        ({**NS, "subscribe": "T", "startingOffsets": "latest"}, False, "startingOffsets"),
        ({**NS, "subscribe": "T", "startingOffsets": "soon"}, False, "startingOffsets"),
        ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b:0": "x"}}'}, False, "startingOffsets"),
        ({**NS, "subscribe": "T", "startingOffsets": '{"T": {"b:0": -3}}'}, True, "startingOffsets"),
        ({**NS, "subscribe": "T", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({**NS, "subscribe": "T", "endingOffsets": '{"T": {"b:0": -2}}'}, False, "endingOffsets"),
        ({**NS, "subscribe": "T", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({**NS, "subscribe": "T", "startingTimestamp": "yesterday"}, False, "startingTimestamp"),
        ({**NS, "subscribe": "T", "maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
        ({**NS, "subscribe": "T", "maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger"),
        (
            {**NS, "subscribe": "T", "minOffsetsPerTrigger": "20", "maxOffsetsPerTrigger": "10"},
            True,
            "minOffsetsPerTrigger",
        ),
        ({**NS, "subscribe": "T", "maxTriggerDelay": "5m"}, True, "maxTriggerDelay"),
        (
            {**NS, "subscribe": "T", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"},
            True,
            "maxTriggerDelay",
        ),
        ({**NS, "subscribe": "T", "minPartitions": "-1"}, False, "minPartitions"),
        ({**NS, "subscribe": "T", "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({**NS, "subscribe": "T", "pullBatchSize": "0"}, False, "pullBatchSize"),
        ({**NS, "subscribe": "T", "pullTimeoutMs": "abc"}, False, "pullTimeoutMs"),
        ({**NS, "subscribe": "T", "readFromSlave": "always"}, False, "readFromSlave"),
        ({**NS, "subscribe": "T", "kafka.bootstrap.servers": "x"}, False, "kafka.bootstrap.servers"),
    ],
)
def test_bad_source_options_name_the_option(options: dict[str, str], streaming: bool, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_options(options, streaming=streaming)
    assert info.value.key == named, str(info.value)
    assert str(info.value).startswith(named)


def test_offsets_json_flat_and_nested() -> None:
    o = src(subscribe="T", startingOffsets='{"T": {"broker-a:0": 5, "broker-b:1": -2}}')
    assert o.starting.kind == "specific"
    assert o.starting.for_queue("T", "broker-a", 0, 99) == 5
    assert o.starting.for_queue("T", "broker-b", 1, 99) == EARLIEST
    assert o.starting.for_queue("T", "broker-a", 3, 99) == 99
    nested = src(True, subscribe="T", startingOffsets='{"T": {"broker-a": {"0": 7, "1": -1}}}')
    assert nested.starting.offsets == {"T": {"broker-a:0": 7, "broker-a:1": LATEST}}
    ending = src(subscribe="T", endingOffsets='{"T": {"broker-a:0": -1}}')
    assert ending.ending.for_queue("T", "broker-a", 0, 0) == LATEST


def test_assign_by_queue_id_and_broker_queue() -> None:
    o = src(assign='{"T": [0, "broker-b:3"]}')
    assert o.assignment is not None
    assert o.assignment.selects("T", "broker-a", 0) and o.assignment.selects("T", "broker-z", 0)
    assert o.assignment.selects("T", "broker-b", 3) and not o.assignment.selects("T", "broker-a", 3)
    assert not o.assignment.selects("U", "broker-a", 0)


def test_trigger_options() -> None:
    o = src(True, subscribe="T", maxOffsetsPerTrigger="100", minOffsetsPerTrigger="10", maxTriggerDelay="30s")
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 10, 30_000)


@pytest.mark.parametrize(
    ("raw", "ms"), [("500ms", 500), ("30s", 30_000), ("15m", 900_000), ("1h", 3_600_000), ("250", 250)]
)
def test_durations(raw: str, ms: int) -> None:
    assert parse_duration_ms("maxTriggerDelay", raw) == ms


def test_sub_expression() -> None:
    assert parse_sub_expression("*") is None and parse_sub_expression(" ") is None
    assert parse_sub_expression("A||B || C") == frozenset({"A", "B", "C"})


def test_sql92_sub_expression() -> None:
    o = src(subscribe="T", subExpression="a > 3 AND TAGS = 'x'", expressionType="sql92")
    assert o.expression_type == "SQL92" and o.tag_set is None
    assert o.executor_options().expression_type == "SQL92"
    assert src(subscribe="T").executor_options().expression_type == "TAG"
    with pytest.raises(ConfigError, match="subExpression.*line 1, column 4"):
        src(subscribe="T", subExpression="a > ", expressionType="SQL92")
    with pytest.raises(ConfigError, match="expressionType"):
        src(subscribe="T", expressionType="BLOOM")


def test_sink_options() -> None:
    s = parse_sink_options({"nameServer": "h:1", "topic": "Out", "sendPipelineDepth": "8"})
    assert (s.topic, s.send_pipeline_depth) == ("Out", 8)
    with pytest.raises(ConfigError, match="^nameServer"):
        parse_sink_options({"topic": "x"})
    with pytest.raises(ConfigError, match="^subscribe"):
        parse_sink_options({"nameServer": "h:1", "subscribe": "x"})
    with pytest.raises(ConfigError, match="^sendPipelineDepth"):
        parse_sink_options({"nameServer": "h:1", "sendPipelineDepth": "0"})
