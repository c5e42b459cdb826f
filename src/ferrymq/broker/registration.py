"""Registration with every name server (protocol §3.2, §3.3, §6.7).

REGISTER_BROKER (103) goes to all name servers in parallel at start, every registerNameServerPeriod,
and after topic changes: ``trigger`` registers REGISTER_COALESCE_MS after the first change of a burst (one
registration for a burst of creates, the route visible well within a second). Header: brokerName,
brokerAddr, clusterName, haServerAddr, brokerId, compressed, bodyCrc32 (CRC32 of the body & 0x7FFFFFFF).

Plain body (``compressedRegister=false``, the default; every name server reads it)::

    {"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{...},"topicConfigTable":{...}}}

assembled from the topic table's kept per-topic fragments (``TopicManager.wrapper_json``: a join, no encode
of every topic). Compressed body (``compressedRegister=true``, header ``compressed=true``, RocketMQ 4.9's
name servers and ours): the layout of ``ferrymq.common.register_body_codec``, encoded and deflated in a
worker thread, so a large topic table never holds the event loop.

A master registers a topic created or changed with REGISTER_TOPIC_IN_NAMESRV (217, RocketMQ 5) instead:
``register_topic`` sends that one topic's queue data, so a creation costs the same with 10 topics or 10,000
(the whole table is 1.9 MB at 12,700 topics, joined on the broker's loop and parsed by every name server).
Header: topic. Body: TopicRouteData, ``{"queueDatas":[{"brokerName","readQueueNums","writeQueueNums","perm",
"topicSysFlag"}],"brokerDatas":[]}``. A name server that does not know the code (RocketMQ 4.x) or refuses it
(it holds no registration of this broker over that connection) gets the whole table instead (``trigger``), as
does every deletion and a burst of more than ``SINGLE_TOPIC_MAX_PENDING`` changes. The periodic registration
still carries the whole table.

A slave remembers the answers' ``haServerAddr`` / ``masterAddr`` (``on_master_info``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ferrymq.common.aio import wait_event
from ferrymq.common.register_body_codec import body_crc32, encode_compressed_register_body
from ferrymq.common.route import QueueData, TopicRouteData
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_MS = 6000
UNREGISTER_TIMEOUT_MS = 3000
#: topic changes register at most once per this period: a lone change registers at once (its route shows within
#: milliseconds, as RocketMQ's registration on topic creation), a burst's later changes ride along together
REGISTER_COALESCE_MS = 100
#: topic changes waiting to be registered one by one; past this many the whole table is registered instead
SINGLE_TOPIC_MAX_PENDING = 256


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
        topic_wrapper: Callable[[], dict[str, Any] | bytes],
        period_ms: int,
        on_master_info: Callable[[str | None, str | None], None] | None = None,
        topic_table: Callable[[], tuple[DataVersion, list[TopicConfig]]] | None = None,
        compressed: bool = False,
        coalesce_ms: int = REGISTER_COALESCE_MS,
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
        #: the TopicConfigSerializeWrapper: a dict, or its JSON already encoded
        self._topic_wrapper = topic_wrapper
        self._default_wrapper = topic_wrapper
        #: (data version, topic configs) for the compressed body; None: built from the wrapper
        self._topic_table = topic_table
        #: send the compressed body (compressedRegister): only to name servers that read it
        self.compressed = compressed
        self.coalesce_ms = coalesce_ms
        self.period_ms = period_ms
        self._on_master_info = on_master_info
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[Any] | None = None
        self._again = False
        #: a change waiting for its registration is urgent (no coalescing wait); the event wakes the wait
        self._urgent = False
        self._urgent_event = asyncio.Event()
        #: loop time when the last triggered registration ended (-inf: none yet)
        self._last_triggered_end = float("-inf")
        self.registrations = 0
        #: topics changed and not registered yet one by one (name -> its config), and the task sending them
        self._single_topics: dict[str, TopicConfig] = {}
        self._single_task: asyncio.Task[None] | None = None
        #: topics registered one by one, and how often a name server's answer sent the whole table instead
        self.single_registrations = 0
        self.single_fallbacks = 0

    def _header(self, compressed: bool = False, crc32: int = 0) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self._broker_addr(),
            "clusterName": self.cluster_name,
            "haServerAddr": self._ha_server_addr(),
            "brokerId": self.current_broker_id,
            "compressed": compressed,
            "bodyCrc32": crc32,
        }

    @property
    def current_broker_id(self) -> int:
        return self.broker_id_of() if self.broker_id_of is not None else self.broker_id

    def body(self) -> bytes:
        """The plain body."""
        wrapper = self._topic_wrapper()
        if isinstance(wrapper, dict):
            wrapper = jsonx.dumps(wrapper)
        return b'{"filterServerList":[],"topicConfigSerializeWrapper":' + wrapper + b"}"

    async def build_body(self) -> tuple[bytes, bool]:
        """(body, compressed): the compressed body is encoded in a worker thread from a copy of the table."""
        if not self.compressed:
            return self.body(), False
        if self._topic_table is not None and self._topic_wrapper is self._default_wrapper:
            version, configs = self._topic_table()
        else:
            wrapper = self._topic_wrapper()
            obj = jsonx.loads(wrapper) if isinstance(wrapper, bytes) else wrapper
            version = DataVersion.from_json(obj.get("dataVersion"))
            configs = [TopicConfig.from_json({**tc, "topicName": name})
                       for name, tc in (obj.get("topicConfigTable") or {}).items()]
        body = await asyncio.to_thread(encode_compressed_register_body, configs, (), version)
        return body, True

    async def register_all(self) -> int:
        """Register with every name server; returns how many accepted."""
        if not self.namesrv_addrs:
            return 0
        body, compressed = await self.build_body()
        crc32 = body_crc32(body)
        results = await asyncio.gather(*(self._register_one(a, body, compressed, crc32) for a in self.namesrv_addrs),
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

    async def _register_one(self, addr: str, body: bytes, compressed: bool, crc32: int) -> RemotingCommand:
        cmd = RemotingCommand.request(RequestCode.REGISTER_BROKER, self._header(compressed, crc32), body)
        return await self._pool.invoke(addr, cmd, REGISTER_TIMEOUT_MS)

    def register_topic(self, tc: TopicConfig, *, urgent: bool = False) -> None:
        """A topic was created or changed: register it alone (REGISTER_TOPIC_IN_NAMESRV), soon; a slave (or a
        controller-mode replica not master now) registers its whole table as before (``trigger``)."""
        if not self.namesrv_addrs:
            return
        if self.current_broker_id != 0 or len(self._single_topics) >= SINGLE_TOPIC_MAX_PENDING:
            self.trigger(urgent=urgent)
            return
        self._single_topics[tc.topic_name] = tc
        if self._single_task is None or self._single_task.done():
            try:
                self._single_task = asyncio.ensure_future(self._register_singles())
            except RuntimeError:  # no running loop (unit tests of managers)
                self._single_task = None

    async def _register_singles(self) -> None:
        pending = self._single_topics
        while pending:
            name = next(iter(pending))
            tc = pending.pop(name)
            body = jsonx.dumps(TopicRouteData(queue_datas=[QueueData(
                self.broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)]).to_json())
            results = await asyncio.gather(*(self._pool.invoke(
                addr, RemotingCommand.request(RequestCode.REGISTER_TOPIC_IN_NAMESRV, {"topic": name}, body),
                REGISTER_TIMEOUT_MS) for addr in self.namesrv_addrs), return_exceptions=True)
            if all(isinstance(r, RemotingCommand) and r.code == ResponseCode.SUCCESS for r in results):
                self.single_registrations += 1
                continue
            # a name server that does not know the code or this broker: the whole table, which covers every
            # topic still pending too
            self.single_fallbacks += 1
            pending.clear()
            self.trigger(urgent=True)

    def trigger(self, *, urgent: bool = False) -> None:
        """Register soon, coalesced; used after topic changes. The first change after a quiet ``coalesce_ms``
        registers at once; changes within ``coalesce_ms`` of the last registration, or while one is on its
        way, are carried by one more registration ``coalesce_ms`` after the last. An ``urgent`` change (a topic
        a client's request created, whose route it asks for next, as RocketMQ registers before answering)
        skips the wait: at once, or right after the registration on its way."""
        if not self.namesrv_addrs:
            return
        if urgent:
            self._urgent = True
            self._urgent_event.set()
        if self._pending is not None and not self._pending.done():
            self._again = True
            return
        try:
            self._pending = asyncio.ensure_future(self._triggered())
        except RuntimeError:  # no running loop (unit tests of managers)
            self._pending = None

    async def _triggered(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            wait_s = self._last_triggered_end + self.coalesce_ms / 1000 - loop.time()
            if wait_s > 0 and not self._urgent:
                self._urgent_event.clear()
                await wait_event(self._urgent_event, wait_s)  # an urgent change ends the wait
            self._again = False
            self._urgent = False
            try:
                await self.register_all()
            except Exception:
                log.exception("registration failed")
            self._last_triggered_end = loop.time()
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
