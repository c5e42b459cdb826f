"""RouteTable unit tests with an injected clock (protocol §3.1, §3.3, §6.7, §7)."""

from __future__ import annotations

import pytest

from ferrymq.common.topic import PERM_INHERIT, PERM_READ, PERM_WRITE, DataVersion, TopicConfig
from ferrymq.namesrv.route_table import BROKER_CHANNEL_EXPIRED_MS, RouteTable
from support.clock import ManualClock

RW = PERM_READ | PERM_WRITE


#: start of the namesrv tests' manual clock
T0_MS = 1_700_000_000_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0_MS)


@pytest.fixture
def table(clock: ManualClock) -> RouteTable:
    return RouteTable(clock_ms=clock)


def topics(*names: str, queues: int = 4, perm: int = RW) -> list[TopicConfig]:
    return [TopicConfig(n, queues, queues, perm) for n in names]


def register_pair(table: RouteTable, name: str = "broker-a", cluster: str = "DefaultCluster",
                  master: str = "10.0.0.1:10911", slave: str = "10.0.0.2:10911",
                  topic_names: tuple[str, ...] = ("T1",)) -> None:
    v = DataVersion(1, 100)
    table.register_broker(cluster, master, name, 0, master.replace("10911", "10912"), data_version=v,
                          topic_configs=topics(*topic_names), channel=("conn", master))
    table.register_broker(cluster, slave, name, 1, slave.replace("10911", "10912"), data_version=v,
                          topic_configs=topics(*topic_names), channel=("conn", slave))


def test_master_and_slave_route(table: RouteTable) -> None:
    register_pair(table)
    route = table.get_topic_route("T1")
    assert route is not None
    assert [q.to_json() for q in route.queue_datas] == [
        {"brokerName": "broker-a", "perm": RW, "readQueueNums": 4, "topicSysFlag": 0, "writeQueueNums": 4}]
    assert route.to_json()["brokerDatas"] == [
        {"brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"}, "brokerName": "broker-a",
         "cluster": "DefaultCluster"}]
    assert table.get_topic_route("nope") is None


def test_slave_learns_master_ha_addr(table: RouteTable) -> None:
    # a slave registering before its master gets nothing
    r = table.register_broker("c", "10.0.0.2:10911", "b", 1, "10.0.0.2:10912", topic_configs=[])
    assert r.master_addr is None and r.ha_server_addr is None
    r = table.register_broker("c", "10.0.0.1:10911", "b", 0, "10.0.0.1:10912", topic_configs=[])
    assert r.master_addr is None  # a master never gets one
    r = table.register_broker("c", "10.0.0.2:10911", "b", 1, "10.0.0.2:10912", topic_configs=[])
    assert (r.master_addr, r.ha_server_addr) == ("10.0.0.1:10911", "10.0.0.1:10912")


def test_slave_registration_creates_no_queue_data(table: RouteTable) -> None:
    table.register_broker("c", "10.0.0.2:10911", "b", 1, "", data_version=DataVersion(1, 1),
                          topic_configs=topics("T1"))
    assert table.get_topic_route("T1") is None
    assert table.all_topics() == []
    assert table.cluster_info()["clusterAddrTable"] == {"c": ["b"]}


def test_master_connection_closed_leaves_slave_only_route(table: RouteTable) -> None:
    register_pair(table)
    assert table.on_channel_closed(("conn", "10.0.0.1:10911")) == ["10.0.0.1:10911"]
    route = table.get_topic_route("T1")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {1: "10.0.0.2:10911"}
    assert route.queue_datas[0].perm == RW and route.queue_datas[0].write_queue_nums == 4
    # the slave now learns it has no master
    r = table.register_broker("DefaultCluster", "10.0.0.2:10911", "broker-a", 1, "x", topic_configs=[],
                              channel=("conn", "10.0.0.2:10911"))
    assert r.master_addr is None
    # the slave going too removes the group, its cluster entry and the topic
    table.on_channel_closed(("conn", "10.0.0.2:10911"))
    assert table.get_topic_route("T1") is None
    assert table.all_topics() == []
    assert table.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_closing_unknown_or_stale_channel_is_harmless(table: RouteTable) -> None:
    table.register_broker("c", "10.0.0.1:10911", "b", 0, "", topic_configs=topics("T"), channel="old")
    # the broker reconnects and re-registers over a new connection; the old one closing must not remove it
    table.register_broker("c", "10.0.0.1:10911", "b", 0, "", topic_configs=topics("T"), channel="new")
    assert table.on_channel_closed("old") == []
    assert table.on_channel_closed("never-seen") == []
    assert table.get_topic_route("T") is not None
    assert table.on_channel_closed("new") == ["10.0.0.1:10911"]
    assert table.get_topic_route("T") is None


def test_expiry_after_120_s_of_silence(table: RouteTable, clock: ManualClock) -> None:
    register_pair(table)
    clock.advance(60_000)
    # only the slave refreshes
    table.register_broker("DefaultCluster", "10.0.0.2:10911", "broker-a", 1, "", topic_configs=[])
    clock.advance(BROKER_CHANNEL_EXPIRED_MS - 60_000)
    assert table.scan_not_active_brokers() == []  # exactly 120 s: not yet
    clock.advance(1)
    expired = table.scan_not_active_brokers()
    assert [e.addr for e in expired] == ["10.0.0.1:10911"]
    assert expired[0].channel == ("conn", "10.0.0.1:10911")
    route = table.get_topic_route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: "10.0.0.2:10911"}
    clock.advance(60_000)
    assert [e.addr for e in table.scan_not_active_brokers()] == ["10.0.0.2:10911"]
    assert table.get_topic_route("T1") is None
    assert table.live_addrs() == []


def test_queue_data_updates_only_on_version_change(table: RouteTable) -> None:
    table.register_broker("c", "m:1", "b", 0, "", data_version=DataVersion(1, 1), topic_configs=topics("T"))
    assert table.wipe_write_perm("b") == 1
    # same version: the broker's table is not re-applied, so the wipe sticks
    table.register_broker("c", "m:1", "b", 0, "", data_version=DataVersion(1, 1), topic_configs=topics("T"))
    assert table.queue_data("T", "b").perm == PERM_READ  # type: ignore[union-attr]
    # a newer version re-applies the table; vanished topics stay (removed only by delete/broker loss)
    table.register_broker("c", "m:1", "b", 0, "", data_version=DataVersion(2, 2),
                          topic_configs=topics("U", queues=8))
    assert table.queue_data("T", "b").perm == PERM_READ  # type: ignore[union-attr]
    assert table.queue_data("U", "b").write_queue_nums == 8  # type: ignore[union-attr]
    assert table.all_topics() == ["T", "U"]


def test_wipe_and_add_write_perm(table: RouteTable) -> None:
    register_pair(table, topic_names=("T1", "T2"))
    table.register_broker("DefaultCluster", "10.0.0.3:10911", "broker-b", 0, "", topic_configs=[
        TopicConfig("T1", 4, 4, RW), TopicConfig("TBW102", 8, 8, RW | PERM_INHERIT)])
    assert table.wipe_write_perm("broker-a") == 2
    assert table.wipe_write_perm("unknown") == 0
    route = table.get_topic_route("T1")
    assert route is not None
    assert {q.broker_name: q.perm for q in route.queue_datas} == {"broker-a": PERM_READ, "broker-b": RW}
    assert table.wipe_write_perm("broker-b") == 2
    assert table.queue_data("TBW102", "broker-b").perm == PERM_READ | PERM_INHERIT  # type: ignore[union-attr]
    assert table.add_write_perm("broker-b") == 2
    assert table.queue_data("TBW102", "broker-b").perm == RW | PERM_INHERIT  # type: ignore[union-attr]
    assert table.queue_data("T1", "broker-a").perm == PERM_READ  # type: ignore[union-attr]


def test_delete_topic(table: RouteTable) -> None:
    register_pair(table, topic_names=("T1", "T2"))
    register_pair(table, name="broker-x", cluster="Other", master="10.1.0.1:10911", slave="10.1.0.2:10911",
                  topic_names=("T1",))
    assert table.delete_topic("T2")
    assert not table.delete_topic("T2")
    assert table.get_topic_route("T2") is None
    # cluster-scoped delete keeps the other cluster's queues
    assert table.delete_topic("T1", "Other")
    route = table.get_topic_route("T1")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-a"]
    assert table.topics_by_cluster("Other") == []
    assert table.delete_topic("T1")
    assert table.all_topics() == []
    # a later registration with an unchanged version does not bring the topic back
    table.register_broker("DefaultCluster", "10.0.0.1:10911", "broker-a", 0, "", data_version=DataVersion(1, 100),
                          topic_configs=topics("T1"), channel=("conn", "10.0.0.1:10911"))
    assert table.all_topics() == []


def test_multiple_clusters(table: RouteTable) -> None:
    register_pair(table, name="a", cluster="C1", master="1.0.0.1:1", slave="1.0.0.2:1", topic_names=("T", "A"))
    register_pair(table, name="b", cluster="C2", master="2.0.0.1:1", slave="2.0.0.2:1", topic_names=("T", "B"))
    table.register_broker("C2", "3.0.0.1:1", "c", 0, "", topic_configs=topics("C"))
    info = table.cluster_info()
    assert info["clusterAddrTable"] == {"C1": ["a"], "C2": ["b", "c"]}
    assert info["brokerAddrTable"]["b"] == {"brokerAddrs": {"0": "2.0.0.1:1", "1": "2.0.0.2:1"},
                                            "brokerName": "b", "cluster": "C2"}
    assert table.topics_by_cluster("C1") == ["A", "T"]
    assert table.topics_by_cluster("C2") == ["B", "C", "T"]
    assert table.topics_by_cluster("none") == []
    route = table.get_topic_route("T")
    assert route is not None
    assert sorted((b.cluster, b.broker_name) for b in route.broker_datas) == [("C1", "a"), ("C2", "b")]
    # C1 going away entirely leaves C2 intact
    table.on_channel_closed(("conn", "1.0.0.1:1"))
    table.on_channel_closed(("conn", "1.0.0.2:1"))
    assert table.clusters() == {"C2": ["b", "c"]}
    assert table.all_topics() == ["B", "C", "T"]


def test_address_switching_broker_id_loses_old_entry(table: RouteTable) -> None:
    register_pair(table)
    table.on_channel_closed(("conn", "10.0.0.1:10911"))
    # the slave is promoted: same address, now id 0, with its own topic table
    r = table.register_broker("DefaultCluster", "10.0.0.2:10911", "broker-a", 0, "10.0.0.2:10912",
                              data_version=DataVersion(5, 5), topic_configs=topics("T1", "T9"), channel="c2")
    assert r.master_addr is None
    bd = table.broker_data("broker-a")
    assert bd is not None and bd.broker_addrs == {0: "10.0.0.2:10911"}
    assert table.all_topics() == ["T1", "T9"]
    # the old connection of the slave identity closing does not matter any more
    assert table.on_channel_closed(("conn", "10.0.0.2:10911")) == []
    assert table.get_topic_route("T9") is not None


def test_new_process_taking_an_id_replaces_old_addr(table: RouteTable, clock: ManualClock) -> None:
    table.register_broker("c", "old:1", "b", 0, "", topic_configs=topics("T"), channel="o")
    table.register_broker("c", "new:1", "b", 0, "", topic_configs=topics("T"), channel="n")
    assert table.live_addrs() == ["new:1"]
    assert table.on_channel_closed("o") == []
    bd = table.broker_data("b")
    assert bd is not None and bd.broker_addrs == {0: "new:1"}


def test_unregister(table: RouteTable) -> None:
    register_pair(table)
    assert not table.unregister_broker("DefaultCluster", "10.0.0.9:1", "broker-a", 0)  # not that address
    assert table.unregister_broker("DefaultCluster", "10.0.0.1:10911", "broker-a", 0)
    route = table.get_topic_route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: "10.0.0.2:10911"}
    assert table.unregister_broker("DefaultCluster", "10.0.0.2:10911", "broker-a", 1)
    assert table.get_topic_route("T1") is None and table.clusters() == {}


def test_query_data_version_refreshes_liveness(table: RouteTable, clock: ManualClock) -> None:
    table.register_broker("c", "m:1", "b", 0, "", data_version=DataVersion(3, 9), topic_configs=topics("T"))
    clock.advance(100_000)
    changed, held = table.query_data_version("m:1", DataVersion(3, 9))
    assert (changed, held) == (False, DataVersion(3, 9))
    clock.advance(100_000)
    assert table.scan_not_active_brokers() == []
    changed, _ = table.query_data_version("m:1", DataVersion(4, 10))
    assert changed
    assert table.query_data_version("unknown:1", DataVersion()) == (True, None)
