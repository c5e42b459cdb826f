"""What the console makes of the cluster's answers, without sockets (a fake admin): brokers that vanish from the
name server or stop answering stay as dead rows, controller replica ids are shown, samples of a silent broker
keep its last value marked unknown (no gap in a chart), severity by threshold."""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.client.admin import BrokerInfo
from ferrymq.console.data import ConsoleData, Samples, replica_lag_severity
from ferrymq.errors import RemotingError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode


@dataclass
class FakeInstance:
    #: addr -> runtime info (None: the broker does not answer)
    runtime: dict[str, dict[str, str] | None] = field(default_factory=dict)

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_ms: int | None = None) -> RemotingCommand:
        assert cmd.code == RequestCode.GET_BROKER_RUNTIME_INFO
        info = self.runtime.get(addr)
        if info is None:
            raise RemotingError(f"timeout after {timeout_ms} ms")
        return cmd.response(0, body=jsonx.dumps({"table": info}))


@dataclass
class FakeAdmin:
    registered: list[BrokerInfo]
    instance: FakeInstance

    async def brokers(self, cluster: str | None = None, *, masters_only: bool = False) -> list[BrokerInfo]:
        return [b for b in self.registered if not masters_only or b.broker_id == 0]


def _info(role: str, max_offset: int, **extra: str) -> dict[str, str]:
    return {"brokerRole": role, "commitLogMaxOffset": str(max_offset), "putTps": "1.5 1 1", **extra}


MASTER = BrokerInfo("C", "broker-a", 0, "10.0.0.1:10911")
SLAVE = BrokerInfo("C", "broker-a", 1, "10.0.0.2:10911")


def _data() -> tuple[ConsoleData, FakeAdmin]:
    admin = FakeAdmin([MASTER, SLAVE], FakeInstance({MASTER.addr: _info("SYNC_MASTER", 1000),
                                                     SLAVE.addr: _info("SLAVE", 400)}))
    return ConsoleData(admin), admin  # type: ignore[arg-type]


async def test_a_broker_gone_from_the_name_server_stays_dead() -> None:
    data, admin = _data()
    rows = await data.brokers()
    assert [(r.broker_id, r.dead, r.lag_bytes) for r in rows] == [(0, False, None), (1, False, 600)]
    admin.registered = [SLAVE]  # the master was killed: the name server dropped it
    admin.instance.runtime[MASTER.addr] = None
    rows = await data.brokers()
    dead = [r for r in rows if r.dead]
    assert [(r.addr, r.role) for r in dead] == [(MASTER.addr, "SYNC_MASTER")]
    assert "did not answer" in dead[0].error
    assert next(r for r in rows if not r.dead).lag_bytes is None  # no live master to be behind
    admin.registered = [MASTER, SLAVE]  # back
    admin.instance.runtime[MASTER.addr] = _info("SYNC_MASTER", 1000)
    assert not any(r.dead for r in await data.brokers())


async def test_a_registered_broker_that_does_not_answer_is_dead() -> None:
    data, admin = _data()
    admin.instance.runtime[SLAVE.addr] = None
    rows = await data.brokers()
    assert [r.dead for r in rows] == [False, True]


async def test_controller_mode_shows_the_controllers_replica_ids() -> None:
    data, admin = _data()
    admin.instance.runtime[MASTER.addr] = _info("SYNC_MASTER", 10, controllerRole='{"replicaId": 3, "masterEpoch": 2}')
    admin.instance.runtime[SLAVE.addr] = _info("SLAVE", 10, controllerRole='{"replicaId": 1, "masterEpoch": 2}')
    rows = await data.brokers()
    assert [(r.broker_id, r.shown_id, r.master_epoch) for r in rows] == [(0, 3, 2), (1, 1, 2)]


async def test_a_silent_broker_keeps_its_last_sample_marked_unknown() -> None:
    data, admin = _data()
    data.groups = _no_groups  # type: ignore[method-assign]
    await data.sample_once()
    admin.instance.runtime[SLAVE.addr] = None  # hung
    await data.sample_once()
    await data.sample_once()
    admin.instance.runtime[SLAVE.addr] = _info("SLAVE", 900)
    await data.sample_once()
    cols = data.samples.as_columns("replicaLagBytes")
    assert cols["series"] == {"replicaLagBytes broker-a/1": [600.0, 600.0, 600.0, 100.0]}
    assert cols["unknown"] == {"replicaLagBytes broker-a/1": [1, 2]}


async def _no_groups() -> list[str]:
    return []


def test_samples_are_a_bounded_ring() -> None:
    samples = Samples(kept=3)
    for i in range(5):
        samples.add(float(i), {"a": float(i)}, frozenset({"a"}) if i == 4 else frozenset())
    assert samples.as_columns() == {"t": [2.0, 3.0, 4.0], "series": {"a": [2.0, 3.0, 4.0]}, "unknown": {"a": [2]}}
    assert samples.latest() == {"a": 4.0} and samples.last("a") == 4.0 and samples.last("b") is None


def test_replication_lag_colours() -> None:
    assert [replica_lag_severity(v) for v in (None, 0, 4, 1 << 20, 64 << 20)] == ["ok", "ok", "low", "warn",
                                                                                    "critical"]
