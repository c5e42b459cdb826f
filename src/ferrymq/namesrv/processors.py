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
| 219  | GET_KVLIST_BY_NAMESPACE            | get_kv_list          |
| 224  | GET_TOPICS_BY_CLUSTER              | get_topics_by_cluster|
| 322  | QUERY_DATA_VERSION                 | query_data_version   |
| 327  | ADD_WRITE_PERM_OF_BROKER           | add_write_perm       |

A missing required header field raises ProtocolError, which the connection answers as SYSTEM_ERROR.
"""

from __future__ import annotations

import logging

from ferrymq.common.topic import DataVersion
from ferrymq.errors import ProtocolError
from ferrymq.namesrv.kv_config import NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from ferrymq.namesrv.register_body import body_crc32, decode_register_body
from ferrymq.namesrv.route_table import RouteTable
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher

log = logging.getLogger(__name__)

SUCCESS = ResponseCode.SUCCESS


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

    def __init__(self, routes: RouteTable, kv: KVConfigManager) -> None:
        self.routes = routes
        self.kv = kv

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
            (rc.GET_KVLIST_BY_NAMESPACE, self.get_kv_list),
            (rc.GET_TOPICS_BY_CLUSTER, self.get_topics_by_cluster),
            (rc.QUERY_DATA_VERSION, self.query_data_version),
        ):
            dispatcher.register(code, handler)

    # ---- brokers -------------------------------------------------------------------------
    def register_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        broker_name = _required(cmd, "brokerName")
        broker_addr = _required(cmd, "brokerAddr")
        cluster = _required(cmd, "clusterName")
        ha_server_addr = cmd.get_str("haServerAddr", "") or ""
        broker_id = _required_int(cmd, "brokerId")
        crc = cmd.get_int("bodyCrc32", 0) or 0
        if crc != 0 and body_crc32(cmd.body) != crc:
            log.warning("register from %s (%s): body crc32 mismatch", conn.peer_addr, broker_addr)
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        body = decode_register_body(cmd.body, compressed=cmd.get_bool("compressed"))
        result = self.routes.register_broker(
            cluster,
            broker_addr,
            broker_name,
            broker_id,
            ha_server_addr,
            data_version=body.data_version,
            topic_configs=body.topic_config_table.values(),
            filter_servers=body.filter_server_list,
            channel=conn,
        )
        order_conf = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return cmd.response(
            SUCCESS,
            {"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr},
            body=jsonx.dumps({"table": order_conf}) if order_conf else b"",
        )

    def unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.routes.unregister_broker(
            _required(cmd, "clusterName"),
            _required(cmd, "brokerAddr"),
            _required(cmd, "brokerName"),
            _required_int(cmd, "brokerId"),
        )
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
