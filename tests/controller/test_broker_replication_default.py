"""Controller mode's replication default (docs/failover.md, *Replication mode*): SYNC with
allAckInSyncStateSet unless broker.conf writes brokerRole=ASYNC_MASTER. The runtime role of a real process is
checked by tests/acceptance/test_failover_controller.py."""

from __future__ import annotations

import pytest

from ferrymq.broker.config import BrokerConfig, BrokerRole, from_properties

BASE = {"enableControllerMode": "true", "controllerAddr": "127.0.0.1:9878", "brokerId": "1"}


def test_nothing_written_means_sync_with_every_member_acknowledging() -> None:
    cfg = from_properties(dict(BASE))
    assert cfg.controller_sync_replication
    assert cfg.all_ack_in_sync_state_set


@pytest.mark.parametrize(("role", "sync"), [("ASYNC_MASTER", False), ("async_master", False),
                                            ("SYNC_MASTER", True), ("SLAVE", True)])
def test_only_an_explicit_async_master_opts_out(role: str, sync: bool) -> None:
    assert from_properties({**BASE, "brokerRole": role}).controller_sync_replication is sync


def test_in_code_configs_follow_the_same_rule() -> None:
    assert BrokerConfig(enable_controller_mode=True).controller_sync_replication
    opted_out = BrokerConfig(enable_controller_mode=True, broker_role=BrokerRole.ASYNC_MASTER, broker_role_set=True)
    assert not opted_out.controller_sync_replication
