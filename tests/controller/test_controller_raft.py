"""RaftNode (pysyncobj) in-process: replication to every node, commands from a follower, an isolated leader
stepping down within the broker heartbeat timeout, the asyncio bridge's timeout; and the config file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferrymq.controller.config import from_properties, parse_peers
from ferrymq.controller.raft import NotLeaderError, RaftNode, RaftSettings, RaftTimeoutError
from ferrymq.controller.state import Status, upsert_replica_cmd
from ferrymq.errors import ConfigError
from support.aio import wait_for
from support.ports import LOOPBACK, free_port

HEARTBEAT_TIMEOUT_MS = 3000
LEADER_WAIT_S = 15.0


@pytest.fixture
async def three_nodes(tmp_path: Path) -> AsyncIterator[list[RaftNode]]:
    addrs = [f"{LOOPBACK}:{free_port()}" for _ in range(3)]
    nodes = [RaftNode(RaftSettings(a, [o for o in addrs if o != a], str(tmp_path / f"n{i}"), HEARTBEAT_TIMEOUT_MS))
             for i, a in enumerate(addrs)]
    loop = asyncio.get_running_loop()
    try:
        for node in nodes:
            await loop.run_in_executor(None, node.start, loop)
        yield nodes
    finally:
        for node in nodes:
            await loop.run_in_executor(None, node.stop)


async def _leader(nodes: list[RaftNode]) -> RaftNode:
    def one() -> RaftNode | None:
        leaders = [n for n in nodes if n.is_leader]
        return leaders[0] if len(leaders) == 1 else None
    found: RaftNode = await wait_for(one, timeout_s=LEADER_WAIT_S, what="one raft leader")
    return found


async def test_commands_reach_every_node_and_followers_forward(three_nodes: list[RaftNode]) -> None:
    leader = await _leader(three_nodes)
    res = await leader.apply(upsert_replica_cmd("c", "b", 1, "h:1", "h:2"))
    assert res.status is Status.SUCCESS
    follower = next(n for n in three_nodes if n is not leader)
    res2 = await follower.apply(upsert_replica_cmd("c", "b", 2, "h:3", "h:4"))
    assert res2.status is Status.SUCCESS
    await wait_for(lambda: all(n.group("b") is not None and len(n.group("b").replicas) == 2  # type: ignore[union-attr]
                               for n in three_nodes), timeout_s=5, what="replicated to every node")
    assert {n.leader_addr for n in three_nodes} == {leader.self_addr}


async def test_isolated_leader_steps_down_within_the_heartbeat_timeout(three_nodes: list[RaftNode]) -> None:
    leader = await _leader(three_nodes)
    loop = asyncio.get_running_loop()
    for node in three_nodes:
        if node is not leader:
            await loop.run_in_executor(None, node.stop)
    t0 = time.monotonic()
    await wait_for(lambda: not leader.is_leader, timeout_s=HEARTBEAT_TIMEOUT_MS / 1000,
                   what="the isolated leader to step down")
    assert time.monotonic() - t0 < HEARTBEAT_TIMEOUT_MS / 1000
    with pytest.raises((RaftTimeoutError, NotLeaderError)):
        await leader.apply(upsert_replica_cmd("c", "b", 3, "x", "y"), timeout_ms=300)


def test_config_keys() -> None:
    cfg = from_properties({"controllerPeers": "n0-127.0.0.1:9878;n1-127.0.0.1:9868", "controllerSelfId": "n1",
                           "controllerListenPort": "9881", "enableElectUncleanMaster": "true",
                           "controllerBrokerHeartbeatTimeoutMs": "5000", "bogus": "1"})
    assert cfg.self_raft_addr == "127.0.0.1:9868" and cfg.other_raft_addrs == ["127.0.0.1:9878"]
    assert cfg.listen_port == 9881 and cfg.elect_unclean and cfg.heartbeat_timeout_ms == 5000
    assert cfg.warnings == ["unknown config key 'bogus' ignored"]
    assert from_properties({}).single_node
    assert parse_peers(" n0-h:1 , n1-h:2 ")[1].raft_addr == "h:2"


@pytest.mark.parametrize("props,key", [
    ({"controllerPeers": "n0:127.0.0.1:1"}, "controllerPeers"),
    ({"controllerPeers": "n0-h:1;n0-h:2"}, "controllerPeers"),
    ({"controllerPeers": "n0-h:1;n1-h:1"}, "controllerPeers"),
    ({"controllerPeers": "n0-h:1", "controllerSelfId": "n5"}, "controllerSelfId"),
    ({"controllerListenPort": "70000"}, "controllerListenPort"),
    ({"controllerListenPort": "x"}, "controllerListenPort"),
    ({"controllerBrokerHeartbeatTimeoutMs": "10"}, "controllerBrokerHeartbeatTimeoutMs"),
    ({"enableElectUncleanMaster": "yes"}, "enableElectUncleanMaster"),
    ({"controllerStorePath": ""}, "controllerStorePath"),
])
def test_bad_config_names_the_key(props: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_properties(props)
    assert info.value.key == key


async def test_full_dump_restores_the_state(tmp_path: Path) -> None:
    """After log compaction the state comes back from raft.dump (the journal alone no longer holds it)."""
    settings = RaftSettings(f"{LOOPBACK}:0", [], str(tmp_path / "n"), HEARTBEAT_TIMEOUT_MS,
                            log_compaction_min_entries=2)
    loop = asyncio.get_running_loop()
    node = RaftNode(settings)
    await loop.run_in_executor(None, node.start, loop)
    try:
        await wait_for(lambda: node.is_leader, timeout_s=LEADER_WAIT_S, what="leader")
        for rid in range(1, 6):
            assert (await node.apply(upsert_replica_cmd("c", "b", rid, f"h:{rid}", "x"))).status is Status.SUCCESS
        await wait_for(lambda: (tmp_path / "n" / "raft.dump").exists(), timeout_s=10, what="full dump written")
    finally:
        await loop.run_in_executor(None, node.stop)
    again = RaftNode(settings)
    await loop.run_in_executor(None, again.start, loop)
    try:
        await wait_for(lambda: again.is_leader, timeout_s=LEADER_WAIT_S, what="leader again")
        await again.apply({"op": "noop"})
        group = again.group("b")
        assert group is not None and sorted(group.replicas) == [1, 2, 3, 4, 5]
    finally:
        await loop.run_in_executor(None, again.stop)
