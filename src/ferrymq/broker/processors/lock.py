"""LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42) — orderly consumers' queue locks (protocol §2.7, §3.5).

Body ``{"consumerGroup":s,"clientId":s,"mqSet":[MessageQueue…]}``; LOCK answers
``{"lockOKMQSet":[…]}`` with the queues now owned by clientId. A lock lives 60 s unless renewed.
UNLOCK always succeeds.

A consumer's UNREGISTER_CLIENT (processors/client_manage.py, through ConsumerManager.on_client_left) releases
every lock its client id still holds in that group: a client unregisters when it leaves, after its consumption
stopped, and the Apache C++ client 2.1's unlock at shutdown leaves out the first queue of each broker
(rocketmq-client-cpp 2.1.0 src/consumer/Rebalance.cpp:273-278), which would keep its successor off that queue
for the lock's lifetime. Each lock is also indexed by (group, client id), so a release costs O(that client's
locks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ferrymq.common.route import MessageQueue
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

if TYPE_CHECKING:
    from ferrymq.broker.context import LockContext

LOCK_MAX_LIVE_MS = 60_000


@dataclass(slots=True)
class LockEntry:
    client_id: str
    last_update_ms: int


class RebalanceLockManager:
    def __init__(self, clock_ms: Callable[[], int], lock_max_live_ms: int = LOCK_MAX_LIVE_MS) -> None:
        self._clock_ms = clock_ms
        self.lock_max_live_ms = lock_max_live_ms
        self._table: dict[str, dict[MessageQueue, LockEntry]] = {}
        #: (group, client id) -> the queues whose lock that client holds in that group
        self._held: dict[tuple[str, str], set[MessageQueue]] = {}

    def try_lock_batch(self, group: str, mqs: list[MessageQueue], client_id: str) -> list[MessageQueue]:
        now = self._clock_ms()
        locks = self._table.setdefault(group, {})
        ok = []
        for mq in mqs:
            entry = locks.get(mq)
            if entry is None or entry.client_id == client_id or now - entry.last_update_ms > self.lock_max_live_ms:
                if entry is not None and entry.client_id != client_id:
                    self._drop_held(group, entry.client_id, mq)
                locks[mq] = LockEntry(client_id, now)
                self._held.setdefault((group, client_id), set()).add(mq)
                ok.append(mq)
        return ok

    def unlock_batch(self, group: str, mqs: list[MessageQueue], client_id: str) -> None:
        locks = self._table.get(group)
        if not locks:
            return
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
                self._drop_held(group, client_id, mq)

    def release_client(self, group: str, client_id: str) -> int:
        """Drop every lock ``client_id`` holds in ``group`` (it left); how many there were."""
        held = self._held.pop((group, client_id), set())
        locks = self._table.get(group) or {}
        for mq in held:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
        return len(held)

    def _drop_held(self, group: str, client_id: str, mq: MessageQueue) -> None:
        held = self._held.get((group, client_id))
        if held is not None:
            held.discard(mq)
            if not held:
                del self._held[(group, client_id)]


def _parse(body: bytes) -> tuple[str, str, list[MessageQueue]]:
    obj = jsonx.loads(body)
    mqs = [MessageQueue.from_json(m) for m in obj.get("mqSet") or []]
    return str(obj.get("consumerGroup", "")), str(obj.get("clientId", "")), mqs


class LockProcessor:
    def __init__(self, ctx: LockContext) -> None:
        self.ctx = ctx
        self.locks = RebalanceLockManager(ctx.clock_ms)

    def register(self, dispatcher: Any) -> None:
        dispatcher.register(RequestCode.LOCK_BATCH_MQ, self.lock)
        dispatcher.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock)

    def lock(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = _parse(cmd.body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"bad lock body: {exc}")
        ok = self.locks.try_lock_batch(group, mqs, client_id)
        return cmd.response(R.SUCCESS, body=jsonx.dumps({"lockOKMQSet": [m.to_json() for m in ok]}))

    def unlock(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = _parse(cmd.body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"bad unlock body: {exc}")
        self.locks.unlock_batch(group, mqs, client_id)
        return cmd.response(R.SUCCESS)
