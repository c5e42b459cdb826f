"""Topic / group / offset tables: journaled changes, snapshots off the event loop, unreadable files refused,
registration coalesced (and compressed when configured), the event-loop lag probe (issue 24, issue 25 #11)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from ferrymq.broker.config_file import JOURNAL_SUFFIX
from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.subscription_manager import SubscriptionGroupConfig, SubscriptionGroupManager
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.common.aio import LoopLagProbe
from ferrymq.common.topic import TopicConfig
from ferrymq.errors import ConfigError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import connect
from support.aio import wait_for
from support.wire import send_v1


def _topics(path: str) -> TopicManager:
    return TopicManager(path, cluster_name="C", broker_name="B", clock_ms=lambda: 7)


def test_topic_changes_are_journaled_not_rewritten(tmp_path) -> None:
    tm = _topics(str(tmp_path))
    for i in range(50):
        tm.update(TopicConfig(f"T{i}", 4, 4))
    assert tm.delete("T3")
    assert not (tmp_path / "topics.json").exists()  # no whole-table write per change
    lines = (tmp_path / ("topics.json" + JOURNAL_SUFFIX)).read_bytes().splitlines()
    assert len(lines) == 51
    again = _topics(str(tmp_path))
    again.load()
    assert again.get("T49") is not None and again.get("T3") is None
    assert again.data_version.counter == tm.data_version.counter == 51


def test_snapshot_folds_the_journal_and_keeps_what_the_bak_needs(tmp_path) -> None:
    tm = _topics(str(tmp_path))
    tm.update(TopicConfig("X", 1, 1))
    tm.persist()  # snapshot 1 (counter 1)
    tm.update(TopicConfig("Y", 1, 1))
    tm.persist()  # snapshot 2 (counter 2); .bak = snapshot 1
    tm.update(TopicConfig("Z", 1, 1))
    # the journal keeps what lies above the .bak's counter: Y and Z
    kept = [json.loads(line)["put"] for line in (tmp_path / ("topics.json" + JOURNAL_SUFFIX)).read_text().splitlines()]
    assert kept == ["Y", "Z"]
    (tmp_path / "topics.json").write_bytes(b"\x00garbage")  # damaged: load falls back to .bak + journal
    again = _topics(str(tmp_path))
    again.load()
    assert {"X", "Y", "Z"} <= set(again.table)


def test_torn_last_journal_line_is_dropped_a_damaged_middle_line_refused(tmp_path) -> None:
    tm = _topics(str(tmp_path))
    tm.update(TopicConfig("X", 1, 1))
    tm.update(TopicConfig("Y", 1, 1))
    journal = tmp_path / ("topics.json" + JOURNAL_SUFFIX)
    data = journal.read_bytes()
    journal.write_bytes(data[:-9])  # a crash inside the last append
    again = _topics(str(tmp_path))
    again.load()
    assert again.get("X") is not None and again.get("Y") is None
    journal.write_bytes(b"{not json\n" + data)
    with pytest.raises(ConfigError, match="line 1"):
        _topics(str(tmp_path)).load()


async def test_async_snapshot_writes_the_rocketmq_file(tmp_path) -> None:
    gm = SubscriptionGroupManager(str(tmp_path), auto_create=True, clock_ms=lambda: 5)
    for i in range(1200):  # more than one step
        gm.update(SubscriptionGroupConfig(f"G{i}", retry_max_times=3))
    assert await gm.snapshot_if_dirty()
    saved = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert saved["dataVersion"]["counter"] == 1200
    assert saved["subscriptionGroupTable"]["G1199"]["retryMaxTimes"] == 3
    assert not await gm.snapshot_if_dirty()  # nothing changed since
    again = SubscriptionGroupManager(str(tmp_path), auto_create=True, clock_ms=lambda: 5)
    again.load()
    assert again.table["G0"].retry_max_times == 3


def test_offset_indexes_follow_the_table(tmp_path) -> None:
    om = ConsumerOffsetManager(str(tmp_path))
    om.commit("g1", "T", 0, 5)
    om.commit("g2", "T", 1, 6)
    om.commit("g1", "U", 0, 7)
    assert om.groups_of_topic("T") == {"g1", "g2"} and om.topics_of_group("g1") == {"T", "U"}
    om.remove_topic("T")
    assert om.groups_of_topic("T") == set() and om.topics_of_group("g1") == {"U"}
    assert om.query("g2", "T", 1) == -1 and om.query("g1", "U", 0) == 7


@pytest.mark.parametrize("damage", ["garbage", "unreadable", "empty", "empty-no-bak"])
def test_unreadable_offsets_and_bak_refuse_to_start(tmp_path, damage) -> None:
    """Issue 25 #11: both files unreadable (an empty file included: ferrymq never writes one) -> a config error
    naming the file, never offsets 0."""
    om = ConsumerOffsetManager(str(tmp_path))
    om.commit("g", "T", 0, 2)
    om.persist()
    om.persist()  # consumerOffset.json and .bak
    for name in ("consumerOffset.json", "consumerOffset.json.bak"):
        path = tmp_path / name
        if damage == "garbage":
            path.write_bytes(b"\x00\x01 not json")
        elif damage == "empty":
            path.write_bytes(b"")
        elif damage == "empty-no-bak":
            path.write_bytes(b"") if name == "consumerOffset.json" else path.unlink()
        else:
            os.chmod(path, 0)
    if damage == "unreadable" and os.access(tmp_path / "consumerOffset.json", os.R_OK):
        pytest.skip("running as a user that reads files without read permission")
    with pytest.raises(ConfigError, match="consumerOffset.json"):
        ConsumerOffsetManager(str(tmp_path)).load()


def test_one_good_copy_is_enough(tmp_path) -> None:
    om = ConsumerOffsetManager(str(tmp_path))
    om.commit("g", "T", 0, 2)
    om.persist()
    om.persist()
    (tmp_path / "consumerOffset.json").write_bytes(b"garbage")
    again = ConsumerOffsetManager(str(tmp_path))
    again.load()
    assert again.query("g", "T", 0) == 2


async def test_loop_lag_probe_sees_a_stall() -> None:
    probe = LoopLagProbe()
    probe.start()
    try:
        await wait_for(lambda: probe.count > 0, timeout_s=5)
        import time

        time.sleep(0.12)  # hold the loop
        await wait_for(lambda: probe.max_lag_s >= 0.1, timeout_s=5)
        assert probe.cumulative()[-1][1] == probe.count
    finally:
        await probe.stop()


async def test_topic_creates_register_once_per_burst_and_route_promptly(broker, namesrv) -> None:
    registrar = broker.registrar
    before = registrar.registrations
    conn = await connect(broker.broker_addr, timeout_ms=3000)
    try:
        for i in range(30):
            resp = await conn.invoke(RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": f"Burst{i}", "readQueueNums": 2, "writeQueueNums": 2,
                                                      "perm": 6}), 3000)
            assert resp.code == 0
    finally:
        conn.close()
    await wait_for(lambda: namesrv.routes.get_topic_route("Burst29") is not None, timeout_s=5)
    assert registrar.registrations - before <= 5  # not one registration per create


async def test_a_lone_topic_change_registers_at_once(broker, namesrv) -> None:
    """Coalescing delays only the changes of a burst: a change after a quiet period is routed at once, as a
    send that auto-creates a topic is followed by consumers asking for its route (coalescing window made far
    longer than the wait, so a delayed registration cannot pass)."""
    registrar = broker.registrar
    registrar.coalesce_ms = 600_000
    await wait_for(lambda: registrar._pending is None or registrar._pending.done(), timeout_s=5)
    conn = await connect(broker.broker_addr, timeout_ms=3000)
    try:
        resp = await conn.invoke(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Lone", "readQueueNums": 1, "writeQueueNums": 1,
                                                  "perm": 6}), 3000)
        assert resp.code == 0
    finally:
        conn.close()
    await wait_for(lambda: namesrv.routes.get_topic_route("Lone") is not None, timeout_s=5)


async def test_a_topic_a_client_created_skips_the_coalescing_wait(broker, namesrv) -> None:
    """A send that auto-creates its topic right after another topic change (here an admin create) is routed at
    once, not a coalescing period later: its producer and consumers ask for the route next (RocketMQ registers
    such a topic before answering). Coalescing window made far longer than the wait."""
    registrar = broker.registrar
    registrar.coalesce_ms = 600_000
    await wait_for(lambda: registrar._pending is None or registrar._pending.done(), timeout_s=5)
    conn = await connect(broker.broker_addr, timeout_ms=3000)
    try:
        resp = await conn.invoke(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "AdminFirst", "readQueueNums": 1, "writeQueueNums": 1,
                                                  "perm": 6}), 3000)
        assert resp.code == 0
        await wait_for(lambda: namesrv.routes.get_topic_route("AdminFirst") is not None, timeout_s=5)
        resp = await conn.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE, send_v1("ClientMade"), b"x"), 3000)
        assert resp.code == 0, resp.remark
    finally:
        conn.close()
    await wait_for(lambda: namesrv.routes.get_topic_route("ClientMade") is not None, timeout_s=5)


@pytest.mark.parametrize("broker_settings", [{"compressed_register": True}])
async def test_compressed_registration_is_accepted_by_our_name_server(broker, namesrv, broker_settings) -> None:
    broker.topics.update(TopicConfig("Zipped", 3, 3))
    assert await broker.registrar.register_all() == 1
    route = namesrv.routes.get_topic_route("Zipped")
    assert route is not None
    assert [q.read_queue_nums for q in route.queue_datas] == [3]


async def test_event_loop_lag_metric_is_exposed(tmp_path) -> None:
    from ferrymq.broker.app import BrokerController
    from support.inproc import broker_config

    ctl = BrokerController(broker_config(str(tmp_path / "s"), metrics_port=0))
    await ctl.start()
    try:
        await wait_for(lambda: ctl.loop_lag.count > 0, timeout_s=5)
        reader, writer = await asyncio.open_connection("127.0.0.1", ctl.metrics_server.port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        text = (await reader.read()).decode()
        writer.close()
        assert "ferrymq_event_loop_lag_seconds_bucket" in text
    finally:
        await ctl.stop()


def test_a_failed_journal_append_leaves_no_torn_line(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write cut short by a full disk is cut back off the journal: loading never meets a damaged middle line;
    the change is kept for the next snapshot."""
    groups = SubscriptionGroupManager(str(tmp_path), auto_create=True, clock_ms=lambda: 1)
    groups.update(SubscriptionGroupConfig("before"))
    journal = tmp_path / ("subscriptionGroup.json" + JOURNAL_SUFFIX)
    size = journal.stat().st_size
    real_write = os.write
    calls = {"n": 0}

    def short_then_full(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:7])  # a short write
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ferrymq.broker.config_file.os.write", short_then_full)
    with pytest.raises(OSError):
        groups.update(SubscriptionGroupConfig("during"))
    monkeypatch.setattr("ferrymq.broker.config_file.os.write", real_write)
    assert journal.stat().st_size == size
    groups.update(SubscriptionGroupConfig("after"))
    again = SubscriptionGroupManager(str(tmp_path), auto_create=False, clock_ms=lambda: 2)
    again.load()
    assert {"before", "after"} <= set(again.table) and "during" not in again.table
    groups.persist()  # the snapshot holds what the journal could not
    third = SubscriptionGroupManager(str(tmp_path), auto_create=False, clock_ms=lambda: 3)
    third.load()
    assert {"before", "during", "after"} <= set(third.table)


def test_an_auto_created_group_is_served_when_the_journal_cannot_be_written(tmp_path, monkeypatch) -> None:
    """A new consumer group's first pull on a full disk: the default config is served (the next snapshot
    persists it) instead of SYSTEM_ERROR."""
    groups = SubscriptionGroupManager(str(tmp_path), auto_create=True, clock_ms=lambda: 1)

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ferrymq.broker.config_file.os.write", full)
    cfg = groups.find("new-group")
    assert cfg is not None and cfg.group_name == "new-group"
    monkeypatch.undo()
    groups.persist()
    again = SubscriptionGroupManager(str(tmp_path), auto_create=False, clock_ms=lambda: 2)
    again.load()
    assert "new-group" in again.table

