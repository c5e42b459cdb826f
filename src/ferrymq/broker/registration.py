"""Registration with every name server (protocol §3.2, §3.3, §6.7).

REGISTER_BROKER (103) goes to all name servers in parallel at start, every registerNameServerPeriod,
and at once after a topic is created or updated. Header: brokerName, brokerAddr, clusterName,
haServerAddr, brokerId, compressed=false, bodyCrc32=0. Body::

    {"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{...},"topicConfigTable":{...}}}

A slave remembers the answers' ``haServerAddr`` / ``masterAddr`` (``on_master_info``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_MS = 6000
UNREGISTER_TIMEOUT_MS = 3000


class NameServerRegistrar:
    def __init__(
        self,
        pool: Any,
        namesrv_addrs: list[str],
        *,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        broker_addr: Callable[[], str],
        ha_server_addr: Callable[[], str],
        topic_wrapper: Callable[[], dict[str, Any]],
        period_ms: int,
        on_master_info: Callable[[str | None, str | None], None] | None = None,
    ) -> None:
        self._pool = pool
        self.namesrv_addrs = list(namesrv_addrs)
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.broker_id = broker_id
        #: controller mode: the id to register under, asked at every registration (0 only while this broker
        #: is a master within its lease); None: ``broker_id``
        self.broker_id_of: Callable[[], int] | None = None
        self._broker_addr = broker_addr
        self._ha_server_addr = ha_server_addr
        self._topic_wrapper = topic_wrapper
        self.period_ms = period_ms
        self._on_master_info = on_master_info
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[Any] | None = None
        self._again = False
        self.registrations = 0

    def _header(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self._broker_addr(),
            "clusterName": self.cluster_name,
            "haServerAddr": self._ha_server_addr(),
            "brokerId": self.current_broker_id,
            "compressed": False,
            "bodyCrc32": 0,
        }

    @property
    def current_broker_id(self) -> int:
        return self.broker_id_of() if self.broker_id_of is not None else self.broker_id

    def body(self) -> bytes:
        return jsonx.dumps({"filterServerList": [], "topicConfigSerializeWrapper": self._topic_wrapper()})

    async def register_all(self) -> int:
        """Register with every name server; returns how many accepted."""
        if not self.namesrv_addrs:
            return 0
        body = self.body()
        results = await asyncio.gather(*(self._register_one(a, body) for a in self.namesrv_addrs),
                                       return_exceptions=True)
        ok = 0
        for addr, res in zip(self.namesrv_addrs, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("register to name server %s failed: %s", addr, res)
                continue
            if res.code != ResponseCode.SUCCESS:
                log.warning("name server %s refused registration: %s %s", addr, res.code, res.remark)
                continue
            ok += 1
            if self._on_master_info is not None and self.current_broker_id != 0:
                self._on_master_info(res.ext_fields.get("haServerAddr") or None,
                                     res.ext_fields.get("masterAddr") or None)
        self.registrations += 1
        return ok

    async def _register_one(self, addr: str, body: bytes) -> RemotingCommand:
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, self._header(), body)
        return await self._pool.invoke(addr, cmd, REGISTER_TIMEOUT_MS)

    def trigger(self) -> None:
        """Register soon (coalesced); used after topic changes."""
        if not self.namesrv_addrs:
            return
        if self._pending is not None and not self._pending.done():
            self._again = True
            return
        try:
            self._pending = asyncio.ensure_future(self._triggered())
        except RuntimeError:  # no running loop (unit tests of managers)
            self._pending = None

    async def _triggered(self) -> None:
        while True:
            self._again = False
            try:
                await self.register_all()
            except Exception:
                log.exception("registration failed")
            if not self._again:
                return

    async def unregister_all(self) -> None:
        header = {k: v for k, v in self._header().items() if k in ("brokerName", "brokerAddr", "clusterName",
                                                                     "brokerId")}

        async def one(addr: str) -> None:
            try:
                await self._pool.invoke(addr, RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header),
                                        UNREGISTER_TIMEOUT_MS)
            except Exception as exc:
                log.info("unregister from %s failed: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in self.namesrv_addrs))

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.period_ms / 1000)
            try:
                await self.register_all()
            except Exception:
                log.exception("periodic registration failed")

    def start_periodic(self) -> None:
        self._task = asyncio.ensure_future(self._periodic())

    async def stop(self) -> None:
        for task in (self._task, self._pending):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._task = self._pending = None
