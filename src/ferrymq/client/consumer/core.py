"""Shared consumer plumbing: broker choice per queue (suggestWhichBrokerId), pull, offset requests.

Broker choice for a queue (protocol §6.8, §6.10): the id the broker last suggested for that queue if it
is in the route, else the lowest id present (the master, or its lowest slave when the master is gone).
Pulls to a slave never carry the commitOffset flag; offset commits go to the master or, with no master,
to the lowest slave.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Self

from ferrymq.client import api
from ferrymq.client.instance import ClientInstance
from ferrymq.client.values import PullResult
from ferrymq.common.route import MASTER_ID, MessageQueue
from ferrymq.errors import ClientError
from ferrymq.remoting.codes import RequestCode

READ_FROM_SLAVE_MODES = ("never", "whenMasterDown", "prefer")
#: broker id asked for when reading from a slave is preferred
PREFERRED_SLAVE_ID = 1


class ConsumerBase:
    """What the pull and push consumers share: the started core and its instance, ``async with``.
    A subclass names its ``_kind`` and defines ``start``/``close``."""

    _kind: ClassVar[str]
    _core: ConsumerCore | None

    @property
    def core(self) -> ConsumerCore:
        if self._core is None:
            raise ClientError(f"{self._kind} consumer is not started")
        return self._core

    @property
    def instance(self) -> ClientInstance:
        return self.core.instance

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ConsumerCore:
    def __init__(self, instance: ClientInstance, group: str, read_from_slave: str = "whenMasterDown") -> None:
        if read_from_slave not in READ_FROM_SLAVE_MODES:
            raise ValueError(f"read_from_slave must be one of {READ_FROM_SLAVE_MODES}")
        self.instance = instance
        self.group = group
        self.read_from_slave = read_from_slave
        self.suggested: dict[MessageQueue, int] = {}

    async def _addrs(self, broker_name: str) -> dict[int, str]:
        addrs = self.instance.broker_addrs.get(broker_name)
        if not addrs:
            self.instance.trigger_route_refresh()
            raise ClientError(f"broker {broker_name} is not in any known route")
        return addrs

    async def pull_addr(self, mq: MessageQueue) -> tuple[str, int]:
        addrs = await self._addrs(mq.broker_name)
        wanted = self.suggested.get(mq, MASTER_ID)
        if self.read_from_slave == "prefer" and wanted == MASTER_ID:
            slaves = sorted(i for i in addrs if i != MASTER_ID)
            if slaves:
                wanted = slaves[0]
        if self.read_from_slave == "never":
            if MASTER_ID not in addrs:
                raise ClientError(f"broker {mq.broker_name} has no master and read_from_slave='never'")
            return addrs[MASTER_ID], MASTER_ID
        if wanted in addrs and not self._avoid(addrs, wanted):
            return addrs[wanted], wanted
        for broker_id in sorted(addrs):
            if not self._avoid(addrs, broker_id):
                return addrs[broker_id], broker_id
        lowest = min(addrs)
        return addrs[lowest], lowest

    def _avoid(self, addrs: dict[int, str], broker_id: int) -> bool:
        """Skip an address that just failed while another member of the group may answer (failover
        before the name server's route shows the master gone)."""
        return len(addrs) > 1 and self.instance.is_suspect(addrs[broker_id])

    async def admin_addr(self, broker_name: str, *, master_only: bool = False) -> str:
        addrs = await self._addrs(broker_name)
        master_required = master_only or self.read_from_slave == "never"
        if MASTER_ID in addrs and (master_required or not self._avoid(addrs, MASTER_ID)):
            return addrs[MASTER_ID]
        if master_required:
            raise ClientError(f"broker {broker_name} has no master in the route")
        candidates = [i for i in sorted(addrs) if i != MASTER_ID and not self._avoid(addrs, i)]
        return addrs[candidates[0] if candidates else min(i for i in addrs if i != MASTER_ID)]

    async def pull(
        self,
        mq: MessageQueue,
        queue_offset: int,
        max_nums: int,
        *,
        sub_expression: str = "*",
        expression_type: str = "TAG",
        sub_version: int = 0,
        commit_offset: int = 0,
        block: bool = False,
        suspend_timeout_ms: int = api.BROKER_SUSPEND_MAX_TIME_MS,
        timeout_ms: int,
        decode: bool = True,
    ) -> PullResult:
        addr, broker_id = await self.pull_addr(mq)
        sys_flag = api.PULL_FLAG_SUBSCRIPTION
        if block:
            sys_flag |= api.PULL_FLAG_SUSPEND
        if commit_offset > 0 and broker_id == MASTER_ID:
            sys_flag |= api.PULL_FLAG_COMMIT_OFFSET
        tags = api.parse_tags(sub_expression) if expression_type.upper() == "TAG" else []
        cmd = api.build_pull(
            group=self.group, mq=mq, queue_offset=queue_offset, max_nums=max_nums, sys_flag=sys_flag,
            commit_offset=max(commit_offset, 0), suspend_timeout_ms=suspend_timeout_ms if block else 0,
            subscription=sub_expression or "*", sub_version=sub_version or int(time.time() * 1000),
            expression_type=expression_type)
        resp = await self.instance.invoke(addr, cmd, timeout_ms)
        result = api.parse_pull(resp, decode=decode, tags=tags)
        self.suggested[mq] = result.suggest_which_broker_id
        return result

    async def query_offset(self, code: int, mq: MessageQueue, **extra: Any) -> int:
        addr = await self.admin_addr(mq.broker_name)
        resp = api.check(await self.instance.invoke(addr, api.build_queue_offset_query(code, mq, **extra)))
        key = "timestamp" if code == RequestCode.GET_EARLIEST_MSG_STORETIME else "offset"
        value = resp.get_int(key)
        if value is None:
            raise ClientError(f"answer to code {code} has no {key}")
        return value

    async def fetch_committed_offset(self, mq: MessageQueue) -> int:
        addr = await self.admin_addr(mq.broker_name)
        resp = await self.instance.invoke(addr, api.build_query_consumer_offset(self.group, mq))
        return api.parse_query_consumer_offset(resp)

    async def commit_offset(self, mq: MessageQueue, offset: int, *, oneway: bool = False) -> None:
        addr = await self.admin_addr(mq.broker_name)
        cmd = api.build_update_consumer_offset(self.group, mq, offset)
        if oneway:
            await self.instance.invoke_oneway(addr, cmd)
        else:
            api.check(await self.instance.invoke(addr, cmd))
