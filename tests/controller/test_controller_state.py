"""The controller's pure state machine: commands, the checks of 1001, elections, JSON round trips."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.controller.liveness import LivenessTable
from ferrymq.controller.state import (
    NO_MASTER,
    STATUS_CODES,
    ControllerState,
    GroupState,
    ReplicaView,
    Status,
    alter_sync_state_set_cmd,
    apply_command,
    choose_master,
    elect_cmd,
    group_to_wire,
    set_controller_addr_cmd,
    upsert_replica_cmd,
)
from ferrymq.remoting.codes import ResponseCode

NAME = "broker-a"


def _state_with(*ids: int) -> ControllerState:
    state = ControllerState()
    for rid in ids:
        assert apply_command(state, upsert_replica_cmd("c", NAME, rid, f"h:{rid}", f"h:{rid + 100}")).status \
            is Status.SUCCESS
    return state


def _alive(*ids: int, offsets: dict[int, int] | None = None) -> dict[int, ReplicaView]:
    offsets = offsets or {}
    return {rid: ReplicaView(alive=True, max_phy_offset=offsets.get(rid, 0)) for rid in ids}


def _elect(state: ControllerState, views: dict[int, ReplicaView], **kw: Any) -> Status:
    g = state.groups[NAME]
    decision = choose_master(g, views, **kw)
    if decision.changed:
        res = apply_command(state, elect_cmd(NAME, g.master_id, g.master_epoch, decision.master_id))
        assert res.status is Status.SUCCESS
    return decision.status


def test_every_status_has_a_code() -> None:
    assert set(STATUS_CODES) == set(Status)
    assert STATUS_CODES[Status.NOT_LEADER] == ResponseCode.CONTROLLER_NOT_LEADER == 2007
    assert STATUS_CODES[Status.METADATA_NOT_EXIST] == 2008


def test_first_broker_of_a_new_group_becomes_master_of_epoch_1() -> None:
    state = _state_with(1)
    assert _elect(state, _alive(1)) is Status.SUCCESS
    g = state.groups[NAME]
    assert (g.master_id, g.master_epoch, g.sync_state_set, g.sync_state_set_epoch) == (1, 1, [1], 1)
    wire = group_to_wire(g, _alive(1))
    assert wire["masterAddr"] == "h:1" and wire["masterHaAddr"] == "h:101"
    assert wire["replicas"]["1"]["alive"] is True


def test_alive_master_stays_and_dead_master_is_replaced_from_the_set() -> None:
    state = _state_with(1, 2, 3)
    _elect(state, _alive(1, 2, 3))
    g = state.groups[NAME]
    assert g.master_id == 1
    # 2 joins the SyncStateSet, 3 does not
    assert apply_command(state, alter_sync_state_set_cmd(NAME, 1, 1, 1, [1, 2])).status is Status.SUCCESS
    assert _elect(state, _alive(1, 2, 3)) is Status.SUCCESS and g.master_epoch == 1  # nothing changes
    # 1 dies; 3 has more data but is not in the set: 2 wins
    assert _elect(state, _alive(2, 3, offsets={3: 999, 2: 5})) is Status.SUCCESS
    assert (g.master_id, g.master_epoch, g.sync_state_set, g.sync_state_set_epoch) == (2, 2, [2], 3)


def test_no_candidate_means_no_master_until_one_in_the_set_returns() -> None:
    state = _state_with(1, 2)
    _elect(state, _alive(1, 2))
    g = state.groups[NAME]
    assert _elect(state, _alive(2)) is Status.MASTER_NOT_AVAILABLE
    assert (g.master_id, g.master_epoch, g.sync_state_set) == (NO_MASTER, 1, [1])
    assert group_to_wire(g)["masterAddr"] == ""
    # unclean election takes any alive replica
    assert _elect(state, _alive(2), unclean=True) is Status.SUCCESS
    assert (g.master_id, g.master_epoch) == (2, 2)


def test_old_master_comes_back_and_is_elected_again() -> None:
    state = _state_with(1, 2)
    _elect(state, _alive(1, 2))
    _elect(state, _alive(2))
    assert _elect(state, _alive(1, 2)) is Status.SUCCESS
    g = state.groups[NAME]
    assert (g.master_id, g.master_epoch) == (1, 2)


def test_highest_offset_then_lowest_id_wins() -> None:
    state = _state_with(1, 2, 3, 4)
    _elect(state, _alive(1))
    apply_command(state, alter_sync_state_set_cmd(NAME, 1, 1, 1, [1, 2, 3, 4]))
    assert choose_master(state.groups[NAME], _alive(2, 3, 4, offsets={2: 5, 3: 9, 4: 9})).master_id == 3


def test_grace_entries_are_not_candidates() -> None:
    state = _state_with(1, 2)
    _elect(state, _alive(1))
    apply_command(state, alter_sync_state_set_cmd(NAME, 1, 1, 1, [1, 2]))
    views = {2: ReplicaView(alive=True, heard=False)}
    assert choose_master(state.groups[NAME], views).status is Status.MASTER_NOT_AVAILABLE


def test_designated_election() -> None:
    state = _state_with(1, 2, 3)
    _elect(state, _alive(1, 2, 3))
    g = state.groups[NAME]
    assert choose_master(g, _alive(1, 2), designated=3).status is Status.BROKER_NOT_ALIVE
    assert choose_master(g, _alive(1, 2), designated=9).status is Status.BROKER_NOT_ALIVE
    same = choose_master(g, _alive(1, 2), designated=1)
    assert same.status is Status.SUCCESS and not same.changed
    # 2 is not in the SyncStateSet: the operator may still choose it
    assert _elect(state, _alive(1, 2), designated=2) is Status.SUCCESS
    assert (g.master_id, g.master_epoch, g.sync_state_set) == (2, 2, [2])


def test_alter_sync_state_set_checks_in_order() -> None:
    state = _state_with(1, 2)
    assert apply_command(state, alter_sync_state_set_cmd("nope", 1, 1, 1, [1])).status is Status.METADATA_NOT_EXIST
    assert apply_command(state, alter_sync_state_set_cmd(NAME, 1, 1, 0, [1])).status is Status.INVALID_MASTER
    _elect(state, _alive(1, 2))
    cases = [
        (alter_sync_state_set_cmd(NAME, 2, 9, 9, [7]), Status.INVALID_MASTER),
        (alter_sync_state_set_cmd(NAME, 1, 0, 9, [7]), Status.FENCED_MASTER_EPOCH),
        (alter_sync_state_set_cmd(NAME, 1, 1, 0, [7]), Status.FENCED_SYNC_STATE_SET_EPOCH),
        (alter_sync_state_set_cmd(NAME, 1, 1, 1, [2]), Status.INVALID_REPLICAS),
        (alter_sync_state_set_cmd(NAME, 1, 1, 1, [1, 7]), Status.INVALID_REPLICAS),
    ]
    for cmd, want in cases:
        res = apply_command(state, cmd)
        assert res.status is want, (cmd, res)
        assert res.remark
    res = apply_command(state, alter_sync_state_set_cmd(NAME, 1, 1, 1, [2, 1]))
    assert res.status is Status.SUCCESS and res.group is not None
    assert res.group["syncStateSet"] == [1, 2] and res.group["syncStateSetEpoch"] == 2


def test_stale_election_is_fenced() -> None:
    state = _state_with(1, 2)
    _elect(state, _alive(1, 2))
    res = apply_command(state, elect_cmd(NAME, NO_MASTER, 0, 2))
    assert res.status is Status.FENCED_MASTER_EPOCH
    assert state.groups[NAME].master_id == 1
    assert apply_command(state, elect_cmd(NAME, 1, 1, 9)).status is Status.INVALID_REPLICAS
    assert apply_command(state, elect_cmd("zz", 1, 1, 1)).status is Status.METADATA_NOT_EXIST


def test_malformed_commands_change_nothing() -> None:
    state = _state_with(1)
    before = state.to_json()
    for cmd in ({"op": "bogus"}, {"op": "elect"}, {"op": "upsertReplica", "brokerName": NAME, "brokerId": "x"},
                upsert_replica_cmd("c", NAME, 0, "a", "b")):
        assert apply_command(state, cmd).status is Status.INVALID_REQUEST
    assert state.to_json() == before


def test_state_json_round_trip() -> None:
    state = _state_with(1, 2)
    _elect(state, _alive(1, 2))
    apply_command(state, set_controller_addr_cmd("127.0.0.1:9000", "127.0.0.1:9880"))
    again = ControllerState.from_json(state.to_json())
    assert again == state
    assert again.controller_addrs == {"127.0.0.1:9000": "127.0.0.1:9880"}


def test_liveness_table() -> None:
    table = LivenessTable(3000)
    table.beat(NAME, 1, 1000, max_phy_offset=5, epoch=1, confirm_offset=4, channel="c1")
    assert table.alive(NAME, 1, 3999) and not table.alive(NAME, 1, 4000)
    v = table.view(NAME, 1, 2000)
    assert v is not None and v.heard and v.max_phy_offset == 5 and v.last_heartbeat_ago_ms == 1000
    assert table.channels(NAME) == ["c1"]
    table.grant_grace([(NAME, 1), (NAME, 2)], 10_000)
    v2 = table.view(NAME, 2, 12_000)
    assert v2 is not None and v2.alive and not v2.heard
    assert table.channels(NAME) == []


# ---- properties ---------------------------------------------------------------------------------------

_ids = st.integers(min_value=1, max_value=5)
_step = st.one_of(
    st.tuples(st.just("join"), _ids),
    st.tuples(st.just("alive"), st.frozensets(_ids)),
    st.tuples(st.just("elect"), st.booleans(), st.one_of(st.none(), _ids)),
    st.tuples(st.just("isr"), st.frozensets(_ids), st.booleans()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_step, max_size=40))
def test_invariants_hold_for_any_history(steps: list[tuple[Any, ...]]) -> None:
    """Epochs never go down and each change of master/set bumps them; the master is always in the set;
    a normal election picks from the SyncStateSet (unless the group never had one, or unclean)."""
    state = ControllerState()
    alive: frozenset[int] = frozenset()
    offsets = {rid: rid * 7 % 5 for rid in range(1, 6)}
    for step in steps:
        g_before = state.groups.get(NAME)
        before = GroupState.from_json(g_before.to_json()) if g_before else None
        if step[0] == "join":
            apply_command(state, upsert_replica_cmd("c", NAME, step[1], "a", "b"))
        elif step[0] == "alive":
            alive = step[1]
        elif step[0] == "elect" and before is not None:
            g = state.groups[NAME]
            views = {rid: ReplicaView(alive=True, max_phy_offset=offsets[rid]) for rid in alive}
            decision = choose_master(g, views, unclean=step[1], designated=step[2])
            if decision.changed:
                res = apply_command(state, elect_cmd(NAME, g.master_id, g.master_epoch, decision.master_id))
                assert res.status is Status.SUCCESS
                if decision.master_id != NO_MASTER:
                    assert decision.master_id in alive
                    assert g.master_epoch == before.master_epoch + 1
                    if step[2] is None and not step[1] and before.sync_state_set:
                        assert decision.master_id in before.sync_state_set
        elif step[0] == "isr" and before is not None:
            g = state.groups[NAME]
            new_set = set(step[1]) | ({g.master_id} if step[2] else set())
            res = apply_command(state, alter_sync_state_set_cmd(NAME, g.master_id, g.master_epoch,
                                                                g.sync_state_set_epoch, sorted(new_set)))
            if res.status is Status.SUCCESS:
                assert g.sync_state_set_epoch == before.sync_state_set_epoch + 1
        after = state.groups.get(NAME)
        if after is not None:
            after.check()
            if before is not None:
                assert after.master_epoch >= before.master_epoch
                assert after.sync_state_set_epoch >= before.sync_state_set_epoch
                if after.sync_state_set != before.sync_state_set:
                    assert after.sync_state_set_epoch > before.sync_state_set_epoch
                if after.master_id not in (before.master_id, NO_MASTER):
                    assert after.master_epoch > before.master_epoch
