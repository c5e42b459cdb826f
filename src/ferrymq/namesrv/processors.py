"""Name server request handlers (protocol §2.3), one function per request code, all answered inline.

| code | request                            | handler              |
|------|------------------------------------|----------------------|
| 100  | PUT_KV_CONFIG                      | put_kv_config        |
| 101  | GET_KV_CONFIG                      | get_kv_config        |
| 102  | DELETE_KV_CONFIG                   | delete_kv_config     |
| 103  | REGISTER_BROKER                    | register_broker      |
| 104  | UNREGISTER_BROKER                  | unregister_broker    |
| 105  | GET_ROUTEINFO_BY_TOPIC             | get_route            |
| 106  | GET_BROKER_CLUSTER_INFO            | get_cluster_info     |
| 205  | WIPE_WRITE_PERM_OF_BROKER          | wipe_write_perm      |
| 206  | GET_ALL_TOPIC_LIST_FROM_NAMESERVER | get_all_topics       |
| 216  | DELETE_TOPIC_IN_NAMESRV            | delete_topic         |
| 217  | REGISTER_TOPIC_IN_NAMESRV          | register_topic       |
| 219  | GET_KVLIST_BY_NAMESPACE            | get_kv_list          |
| 224  | GET_TOPICS_BY_CLUSTER              | get_topics_by_cluster|
| 322  | QUERY_DATA_VERSION                 | query_data_version   |
| 327  | ADD_WRITE_PERM_OF_BROKER           | add_write_perm       |

A missing required header field raises ProtocolError, which the connection answers as SYSTEM_ERROR.

REGISTER_BROKER at estate size: a registration whose DataVersion the name server already holds is answered at
once without reading its topic table (RocketMQ skips unchanged tables too). A changed table with more than
``REGISTER_INLINE_MAX_TOPICS`` topics (a plain body: more than ``REGISTER_INLINE_MAX_BODY_BYTES``) is parsed,
decoded and applied in steps of about ``REGISTER_STEP_TOPICS``, yielding to the event loop between steps, so
a 10,000-topic registration never holds the loop for long; registrations of one broker address are applied
one at a time, and a broker removed meanwhile (unregister, connection closed, expiry) stops the steps. The
DataVersion is recorded only once the whole table is applied.

UNREGISTER_BROKER is accepted only over the connection the address registered on (a broker unregisters over
the connection it registers on), or, with aclEnable, from an admin account: an unsigned request from
elsewhere cannot drop a live broker's routes (NO_PERMISSION). A registration that would take a live
address away from another, still open connection from another host is refused the same way when aclEnable
is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ferrymq.common.register_body_codec import (
    CompressedRegisterBodyReader,
    PlainRegisterBodyReader,
    body_crc32,
    decode_register_envelope,
    topic_config_from_json,
)
from ferrymq.common.route import QueueData
from ferrymq.common.topic import DataVersion, TopicConfig
from ferrymq.errors import ProtocolError
from ferrymq.namesrv.kv_config import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from ferrymq.namesrv.route_table import RegisterBrokerResult, RouteTable
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher

log = logging.getLogger(__name__)

SUCCESS = ResponseCode.SUCCESS
#: A changed topic table up to this many topics is applied in one go; a larger one in steps.
REGISTER_INLINE_MAX_TOPICS = 500
#: Topics decoded and applied per step of a large registration: about 0.8 ms of the event loop on the 2-core test
#: machine (decoding is ~2.6 us a topic, applying ~0.4 us), the longest a route query waits behind one
REGISTER_STEP_TOPICS = 250
#: A plain body up to this size is parsed in one go (about 500 topics); a larger one in steps
REGISTER_INLINE_MAX_BODY_BYTES = 80 * 1024

#: (conn, cmd) -> True when the request may act on a broker registered over another connection
#: (the app passes an admin-signature check when aclEnable is on)
AdminCheck = Callable[[Connection, RemotingCommand], bool]


def _required(cmd: RemotingCommand, key: str) -> str:
    value = cmd.ext_fields.get(key)
    if value is None:
        raise ProtocolError(f"the custom field <{key}> is null")
    return value


def _required_int(cmd: RemotingCommand, key: str) -> int:
    value = cmd.get_int(key)
    if value is None:
        raise ProtocolError(f"the custom field <{key}> is null")
    return value


def topic_not_exist_remark(topic: str) -> str:
    return f"No topic route info in name server for the topic: {topic}"


class NamesrvProcessors:
    """Binds the request handlers to one RouteTable and one KVConfigManager."""

    def __init__(self, routes: RouteTable, kv: KVConfigManager, admin_check: AdminCheck | None = None) -> None:
        self.routes = routes
        self.kv = kv
        #: None: no ACL; UNREGISTER_BROKER still only from the registering connection
        self.admin_check = admin_check
        #: broker addr -> (lock, registrations holding or awaiting it) while one is applied in steps
        self._applying: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def register_all(self, dispatcher: Dispatcher) -> None:
        rc = RequestCode
        for code, handler in (
            (rc.PUT_KV_CONFIG, self.put_kv_config),
            (rc.GET_KV_CONFIG, self.get_kv_config),
            (rc.DELETE_KV_CONFIG, self.delete_kv_config),
            (rc.REGISTER_BROKER, self.register_broker),
            (rc.UNREGISTER_BROKER, self.unregister_broker),
            (rc.GET_ROUTEINFO_BY_TOPIC, self.get_route),
            (rc.GET_BROKER_CLUSTER_INFO, self.get_cluster_info),
            (rc.WIPE_WRITE_PERM_OF_BROKER, self.wipe_write_perm),
            (rc.ADD_WRITE_PERM_OF_BROKER, self.add_write_perm),
            (rc.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.get_all_topics),
            (rc.DELETE_TOPIC_IN_NAMESRV, self.delete_topic),
            (rc.REGISTER_TOPIC_IN_NAMESRV, self.register_topic),
            (rc.GET_KVLIST_BY_NAMESPACE, self.get_kv_list),
            (rc.GET_TOPICS_BY_CLUSTER, self.get_topics_by_cluster),
            (rc.QUERY_DATA_VERSION, self.query_data_version),
        ):
            dispatcher.register(code, handler)

    # ---- brokers -------------------------------------------------------------------------
    def register_broker(self, conn: Connection, cmd: RemotingCommand) -> Any:
        broker_name = _required(cmd, "brokerName")
        broker_addr = _required(cmd, "brokerAddr")
        cluster = _required(cmd, "clusterName")
        ha_server_addr = cmd.get_str("haServerAddr", "") or ""
        broker_id = _required_int(cmd, "brokerId")
        crc = cmd.get_int("bodyCrc32", 0) or 0
        if crc != 0 and body_crc32(cmd.body) != crc:
            log.warning("register from %s (%s): body crc32 mismatch", conn.peer_addr, broker_addr)
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        refusal = self._takeover_refusal(conn, cmd, broker_addr)
        if refusal is not None:
            return refusal
        table = _TopicTable(cmd.body, cmd.get_bool("compressed"))
        reg = _Registration(cluster, broker_addr, broker_name, broker_id, ha_server_addr, table, conn)
        if broker_addr in self._applying:  # another registration of this address is being applied
            return self._register_in_steps(cmd, reg)
        wanted = self.routes.topics_wanted(broker_addr, broker_name, broker_id, table.data_version)
        if not wanted or table.small:
            if wanted:
                result = self._register(reg, table.all_topics(), table.data_version)
            else:
                table.skip_topics()
                result = self._register(reg, None, table.data_version)
            return self._register_answer(cmd, result)
        return self._register_in_steps(cmd, reg)

    def _register(self, reg: _Registration, topic_configs: list[TopicConfig] | None,  # None: not read
                  data_version: DataVersion | None) -> RegisterBrokerResult:
        return self.routes.register_broker(
            reg.cluster, reg.broker_addr, reg.broker_name, reg.broker_id, reg.ha_server_addr,
            data_version=data_version, topic_configs=topic_configs,
            filter_servers=reg.table.filter_server_list, channel=reg.conn)

    async def _register_in_steps(self, cmd: RemotingCommand, reg: _Registration) -> RemotingCommand:
        entry = self._applying.get(reg.broker_addr)
        if entry is None:
            entry = self._applying[reg.broker_addr] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                table = reg.table
                if not self.routes.topics_wanted(reg.broker_addr, reg.broker_name, reg.broker_id,
                                                 table.data_version):
                    table.skip_topics()
                    return self._register_answer(cmd, self._register(reg, None, table.data_version))
                # liveness now; the DataVersion only once the whole table is in (a registration of the same
                # version arriving meanwhile then applies it again instead of skipping a half-applied table)
                result = self._register(reg, None, None)
                live = self.routes.live_info(reg.broker_addr)
                applied = 0
                for batch in table.batches(REGISTER_STEP_TOPICS):
                    await asyncio.sleep(0)
                    if self.routes.live_info(reg.broker_addr) is not live:
                        log.info("registration of %s superseded after %d topics", reg.broker_addr, applied)
                        return self._register_answer(cmd, result)
                    applied += self.routes.upsert_topics(reg.broker_name, batch)
                self.routes.finish_registration(reg.broker_addr, table.data_version, table.filter_server_list)
                log.info("registered %s (%s) with %d topics in steps", reg.broker_addr, reg.broker_name, applied)
                return self._register_answer(cmd, result)
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._applying[reg.broker_addr]

    def _register_answer(self, cmd: RemotingCommand, result: RegisterBrokerResult) -> RemotingCommand:
        order_conf = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return cmd.response(
            SUCCESS,
            {"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr},
            body=jsonx.dumps({"table": order_conf}) if order_conf else b"",
        )

    def _takeover_refusal(self, conn: Connection, cmd: RemotingCommand, broker_addr: str) -> RemotingCommand | None:
        """With aclEnable, a live address registered over another open connection from another host is
        not taken over by an unsigned registration."""
        if self.admin_check is None:
            return None
        live = self.routes.live_info(broker_addr)
        holder = live.channel if live is not None else None
        if not isinstance(holder, Connection) or holder is conn or holder.closed:
            return None
        if _peer_host(holder) == _peer_host(conn) or self.admin_check(conn, cmd):
            return None
        log.warning("refused registration of %s from %s: registered over a live connection from %s",
                    broker_addr, conn.peer_addr, holder.peer_addr)
        return cmd.response(ResponseCode.NO_PERMISSION,
                            remark=f"broker {broker_addr} is registered over another live connection")

    def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _required(cmd, "clusterName")
        broker_addr = _required(cmd, "brokerAddr")
        broker_name = _required(cmd, "brokerName")
        broker_id = _required_int(cmd, "brokerId")
        live = self.routes.live_info(broker_addr)
        if live is not None and live.channel is not conn:
            if self.admin_check is None or not self.admin_check(conn, cmd):
                log.warning("refused UNREGISTER_BROKER of %s from %s: not the connection it registered on",
                            broker_addr, conn.peer_addr)
                return cmd.response(ResponseCode.NO_PERMISSION,
                                    remark=f"broker {broker_addr} may be unregistered only over the connection "
                                           "it registered on" + (" or by an admin account"
                                                                 if self.admin_check is not None else ""))
        self.routes.unregister_broker(cluster, broker_addr, broker_name, broker_id)
        return cmd.response(SUCCESS)

    def query_data_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_addr = _required(cmd, "brokerAddr")
        try:
            version = DataVersion.from_json(jsonx.loads(cmd.body) if cmd.body else None)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"bad DataVersion body: {exc}") from None
        changed, held = self.routes.query_data_version(broker_addr, version)
        return cmd.response(SUCCESS, {"changed": changed},
                            body=jsonx.dumps(held.to_json()) if held is not None else b"")

    def wipe_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _required(cmd, "brokerName")
        count = self.routes.wipe_write_perm(broker_name)
        log.info("wiped write perm of %s on %d topics (from %s)", broker_name, count, conn.peer_addr)
        return cmd.response(SUCCESS, {"wipeTopicCount": count})

    def add_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _required(cmd, "brokerName")
        count = self.routes.add_write_perm(broker_name)
        log.info("restored write perm of %s on %d topics (from %s)", broker_name, count, conn.peer_addr)
        return cmd.response(SUCCESS, {"addTopicCount": count})

    # ---- routes and topics -------------------------------------------------------------------
    def get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _required(cmd, "topic")
        route = self.routes.get_topic_route(topic)
        if route is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, remark=topic_not_exist_remark(topic))
        route.order_topic_conf = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        return cmd.response(SUCCESS, body=jsonx.dumps(route.to_json()))

    def get_cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(SUCCESS, body=jsonx.dumps(self.routes.cluster_info()))

    def get_all_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(SUCCESS, body=jsonx.dumps({"topicList": self.routes.all_topics()}))

    def get_topics_by_cluster(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _required(cmd, "cluster")
        return cmd.response(SUCCESS, body=jsonx.dumps({"topicList": self.routes.topics_by_cluster(cluster)}))

    def delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _required(cmd, "topic")
        cluster = cmd.get_str("clusterName") or None
        if self.routes.delete_topic(topic, cluster):
            log.info("deleted topic %s%s (from %s)", topic, f" in cluster {cluster}" if cluster else "",
                     conn.peer_addr)
        return cmd.response(SUCCESS)

    def register_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """REGISTER_TOPIC_IN_NAMESRV (RocketMQ 5): one topic's queue data, as a broker sends it for a topic just
        created or changed instead of its whole table. Applied for a broker name whose master registered over
        this very connection; anything else (a broker this name server does not hold, another connection) is
        answered SYSTEM_ERROR, and the broker registers its whole table instead."""
        topic = _required(cmd, "topic")
        try:
            obj = jsonx.loads(cmd.body) if cmd.body else {}
            queue_datas = obj.get("queueDatas") or [] if isinstance(obj, dict) else None
            if not isinstance(queue_datas, list):
                raise ValueError("queueDatas is not a list")
            configs = [(qd.broker_name, TopicConfig(topic, qd.read_queue_nums, qd.write_queue_nums, qd.perm,
                                                    "SINGLE_TAG", qd.topic_sys_flag))
                       for qd in map(QueueData.from_json, queue_datas)]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"bad topic route body: {exc}")
        for broker_name, _tc in configs:
            if self.routes.master_channel(broker_name) is not conn:
                return cmd.response(ResponseCode.SYSTEM_ERROR,
                                    remark=f"broker {broker_name} is not registered over this connection")
        for broker_name, tc in configs:
            self.routes.upsert_topics(broker_name, (tc,))
        return cmd.response(SUCCESS)

    # ---- KV config ------------------------------------------------------------------------
    def put_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.kv.put(_required(cmd, "namespace"), _required(cmd, "key"), _required(cmd, "value"))
        return cmd.response(SUCCESS)

    def get_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        namespace, key = _required(cmd, "namespace"), _required(cmd, "key")
        value = self.kv.get(namespace, key)
        if value is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                                remark=f"No config item, Namespace: {namespace} Key: {key}")
        return cmd.response(SUCCESS, {"value": value})

    def delete_kv_config(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.kv.delete(_required(cmd, "namespace"), _required(cmd, "key"))
        return cmd.response(SUCCESS)

    def get_kv_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        namespace = _required(cmd, "namespace")
        table = self.kv.namespace(namespace)
        if table is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, remark=f"No config item, Namespace: {namespace}")
        return cmd.response(SUCCESS, body=jsonx.dumps({"table": table}))


def _peer_host(conn: Connection) -> str:
    return conn.peer_addr.rpartition(":")[0].strip("[]")


class _TopicTable:
    """A REGISTER_BROKER body read as far as needed: the DataVersion at once, the topic entries only when
    asked (all, or in batches). A plain body larger than ``REGISTER_INLINE_MAX_BODY_BYTES`` is parsed in
    steps too (``PlainRegisterBodyReader``), so its parse never holds the loop in one block."""

    __slots__ = ("data_version", "topic_count", "filter_server_list", "_reader", "_plain", "_raw_table")

    def __init__(self, body: bytes, compressed: bool) -> None:
        self._reader: CompressedRegisterBodyReader | None = None
        self._plain: PlainRegisterBodyReader | None = None
        self._raw_table: dict[str, Any] = {}
        #: topics in the table; None: not known before the steps have read them (a large plain body)
        self.topic_count: int | None
        if compressed and body:
            self._reader = CompressedRegisterBodyReader(body)
            self.data_version = self._reader.data_version
            self.topic_count = self._reader.topic_count
            self.filter_server_list: list[str] = []
            return
        if len(body) > REGISTER_INLINE_MAX_BODY_BYTES:
            self._plain = PlainRegisterBodyReader(body)
            self.data_version = self._plain.data_version
            self.filter_server_list = self._plain.filter_server_list
            self.topic_count = None
            return
        envelope = decode_register_envelope(body)
        self.data_version = envelope.data_version
        self.filter_server_list = envelope.filter_server_list
        self._raw_table = envelope.raw_topic_table
        self.topic_count = len(self._raw_table)

    @property
    def small(self) -> bool:
        """Few enough topics to apply in one go."""
        return self.topic_count is not None and self.topic_count <= REGISTER_INLINE_MAX_TOPICS

    def skip_topics(self) -> None:
        """Pass over the topic entries unread (an unchanged table); the filter server list is then known."""
        if self._reader is not None:
            self._reader.skip_topics()
            self.filter_server_list = self._reader.filter_server_list()

    def batches(self, size: int) -> Iterator[list[TopicConfig]]:
        reader = self._reader
        if reader is not None:
            while batch := reader.read_topics(size):
                yield batch
            self.filter_server_list = reader.filter_server_list()
            return
        plain = self._plain
        if plain is not None:
            while batch := plain.read_topics(size):
                yield batch
            self.filter_server_list = plain.filter_server_list  # the last step read what follows the table
            return
        items = list(self._raw_table.items())
        for start in range(0, len(items), size):
            yield [topic_config_from_json(name, raw) for name, raw in items[start:start + size]]

    def all_topics(self) -> list[TopicConfig]:
        return [tc for batch in self.batches(max(1, self.topic_count or REGISTER_STEP_TOPICS)) for tc in batch]


class _Registration:
    __slots__ = ("cluster", "broker_addr", "broker_name", "broker_id", "ha_server_addr", "table", "conn")

    def __init__(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int, ha_server_addr: str,
                 table: _TopicTable, conn: Connection) -> None:
        self.cluster = cluster
        self.broker_addr = broker_addr
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.ha_server_addr = ha_server_addr
        self.table = table
        self.conn = conn
