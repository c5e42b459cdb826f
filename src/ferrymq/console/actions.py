"""What an admin can do from the console, each through the client's admin API (``client.admin``, ``ops``,
``ops_admin``, ``ops_more``, ``controller_admin``). Every action returns a one-line outcome for the page;
a refusal is a ``ClientError`` / ``BrokerError`` whose text the page shows (nothing was changed).

| action            | through                                                             |
|-------------------|---------------------------------------------------------------------|
| create_topic      | Admin.create_topic on every master (or one cluster's)               |
| update_topic      | Admin.create_topic on each master serving the topic (queue counts and perm) |
| delete_topic      | Admin.delete_topic (brokers, then name servers)                     |
| send_test         | a producer of group ``CONSOLE_PRODUCER_GROUP``                      |
| create_group      | Admin.create_subscription_group on every master                     |
| delete_group      | ops_more.delete_group on every master                               |
| reset_offset      | ops.reset_offset (INVOKE_BROKER_TO_RESET_OFFSET) to a time          |
| skip_backlog      | ops.reset_offset to each queue's max offset                         |
| resend_dlq        | the message viewed by id, sent again to its original or retry topic |
| set_broker_config | ops.update_broker_config (the broker refuses keys not runtime-safe) |
| elect             | ControllerAdmin.elect (controller mode)                             |
"""

from __future__ import annotations

from ferrymq.client import Admin, Producer, new_message, ops, ops_more
from ferrymq.client.admin import check_message_id
from ferrymq.common.route import MessageQueue
from ferrymq.common.topic import PERM_INHERIT, PERM_READ, PERM_WRITE, dlq_topic, validate_topic
from ferrymq.console.data import (
    CONSOLE_PRODUCER_GROUP,
    ConsoleData,
    broker_of,
    resend_properties,
    resend_target,
)
from ferrymq.errors import ClientError, TopicNotExistError

#: most queues a topic may be given from the console (RocketMQ Dashboard's limit too)
MAX_QUEUE_NUMS = 1024
#: most bytes of a test message's body typed into the console
MAX_TEST_BODY_BYTES = 64 * 1024
#: how long a test send waits for the name server to route a topic just created
SEND_ROUTE_WAIT_MS = 5_000
#: the permission bits a topic may carry (4 read, 2 write, 1 inherit)
TOPIC_PERM_BITS = PERM_READ | PERM_WRITE | PERM_INHERIT


def check_perm(perm: int) -> int:
    if perm & ~TOPIC_PERM_BITS or not perm & (PERM_READ | PERM_WRITE):
        raise ClientError(f"perm must be 6 (read and write), 4 (read) or 2 (write); got {perm}")
    return perm


def check_queue_nums(value: int, what: str) -> int:
    if not 1 <= value <= MAX_QUEUE_NUMS:
        raise ClientError(f"{what} must be 1..{MAX_QUEUE_NUMS}; got {value}")
    return value


class ConsoleActions:
    def __init__(self, admin: Admin, data: ConsoleData) -> None:
        self.admin = admin
        self.data = data
        self._producer: Producer | None = None

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
            self._producer = None

    async def producer(self) -> Producer:
        if self._producer is None:
            cfg = self.admin.config
            producer = Producer(list(cfg.name_servers), CONSOLE_PRODUCER_GROUP, access_key=cfg.access_key,
                                secret_key=cfg.secret_key, tls=cfg.tls)
            await producer.start()
            self._producer = producer
        return self._producer

    # ---- topics --------------------------------------------------------------------------------------------
    async def create_topic(self, topic: str, read_queue_nums: int, write_queue_nums: int, perm: int,
                           cluster: str | None = None) -> str:
        reason = validate_topic(topic)
        if reason:
            raise ClientError(reason)
        check_queue_nums(read_queue_nums, "read queues")
        check_queue_nums(write_queue_nums, "write queues")
        check_perm(perm)
        await self.admin._require_masters(cluster, None, f"create topic {topic}")
        addrs = await self.admin.create_topic(topic, cluster=cluster or None, read_queue_nums=read_queue_nums,
                                              write_queue_nums=write_queue_nums, perm=perm)
        return f"topic {topic} created on {len(addrs)} master(s): {', '.join(addrs)}"

    async def update_topic(self, topic: str, read_queue_nums: int, write_queue_nums: int, perm: int) -> str:
        check_queue_nums(read_queue_nums, "read queues")
        check_queue_nums(write_queue_nums, "write queues")
        check_perm(perm)
        route = await self.admin.topic_route(topic)
        serving = {qd.broker_name for qd in route.queue_datas}
        await self.admin._require_masters(None, serving, f"update topic {topic}")
        addrs = [b.addr for b in await self.admin.brokers(masters_only=True) if b.broker_name in serving]
        for addr in addrs:
            await self.admin.create_topic(topic, broker_addr=addr, read_queue_nums=read_queue_nums,
                                          write_queue_nums=write_queue_nums, perm=perm)
        return (f"topic {topic} updated on {len(addrs)} master(s): {read_queue_nums} read / {write_queue_nums} "
                f"write queues, perm {perm}")

    async def delete_topic(self, topic: str) -> str:
        await self.admin.delete_topic(topic)
        return f"topic {topic} deleted from its masters and the name servers"

    async def send_test(self, topic: str, body: str, tags: str = "", keys: str = "") -> str:
        data = body.encode("utf-8")
        if len(data) > MAX_TEST_BODY_BYTES:
            raise ClientError(f"a test message body is at most {MAX_TEST_BODY_BYTES} bytes")
        try:
            # a topic created a moment ago is routed at its broker's next registration; never let a test send
            # fall back to TBW102 (it would auto-create a mistyped topic, or pick a queue the topic lacks)
            await self.admin.wait_for_route(topic, timeout_ms=SEND_ROUTE_WAIT_MS)
        except TopicNotExistError:
            raise ClientError(f"the name server does not route topic {topic}: create it first") from None
        producer = await self.producer()
        result = await producer.send(new_message(topic, data, tags=tags or None, keys=keys.split() or None))
        return (f"sent to {topic}: {result.status.name}, msgId {result.msg_id}, offsetMsgId {result.offset_msg_id}, "
                f"queue {result.message_queue.broker_name}/{result.message_queue.queue_id} "
                f"offset {result.queue_offset}")

    # ---- groups --------------------------------------------------------------------------------------------
    async def create_group(self, group: str, retry_max_times: int = 16, broadcast: bool = False) -> str:
        if not group or validate_topic(group):
            raise ClientError(f"bad group name {group!r}: letters, digits, '_', '-', '|', '%' only")
        if not 0 <= retry_max_times <= 64:
            raise ClientError("retry max times must be 0..64")
        addrs = await self.admin.create_subscription_group(group, retry_max_times=retry_max_times,
                                                           consume_broadcast_enable=broadcast)
        return f"consumer group {group} created on {len(addrs)} master(s)"

    async def delete_group(self, group: str) -> str:
        await self.admin._require_masters(None, None, f"delete group {group}")
        addrs = await ops_more.delete_group(self.admin, group)
        return f"consumer group {group} deleted on {len(addrs)} master(s)"

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> str:
        rows = await ops.reset_offset(self.admin, group, topic, timestamp_ms)
        told = max((r["clientsNotified"] for r in rows), default=0)
        return (f"offsets of {group} on {topic} reset in {len(rows)} queue(s): "
                + ", ".join(f"{r['brokerName']}/{r['queueId']}={r['offset']}" for r in rows[:16])
                + (" …" if len(rows) > 16 else "") + f"; {told} live client(s) told")

    async def skip_backlog(self, group: str, topic: str) -> str:
        rows = await ops.reset_offset(self.admin, group, topic, ops.RESET_TO_MAX_TIMESTAMP)
        return f"backlog of {group} on {topic} skipped: {len(rows)} queue(s) moved to their max offset"

    async def resend_dlq(self, group: str, offset_msg_id: str, to_original: bool) -> str:
        msg = await self.admin.view_message(check_message_id(offset_msg_id))
        if msg.topic != dlq_topic(group):
            raise ClientError(f"message {offset_msg_id} is not in {dlq_topic(group)} (it is in {msg.topic})")
        target = resend_target(msg, group, to_original)
        producer = await self.producer()
        queue: MessageQueue | None = None
        if not to_original:
            try:
                # the producer's own copy of the route too: one it made from TBW102's before the retry topic was
                # routed would offer queues the retry topic does not have
                await producer.instance.update_route(target)
            except TopicNotExistError:
                # the name server learns a retry topic at the broker's next registration, and the broker creates
                # it (one queue) on the first send to it: send to queue 0 of the broker holding the dead letter
                dlq_route = await producer.instance.get_route(msg.topic)  # (its brokers' addresses, for the send)
                holder = broker_of(msg, await self.admin.brokers()) or dlq_route.broker_datas[0].broker_name
                queue = MessageQueue(target, holder, 0)
        props = resend_properties(msg)
        result = await producer.send(new_message(target, msg.body, properties=props), queue=queue)
        return (f"dead-lettered message {offset_msg_id} sent again to {target}: {result.status.name}, "
                f"msgId {result.msg_id}")

    # ---- brokers and controllers ---------------------------------------------------------------------------
    async def set_broker_config(self, broker_addr: str, key: str, value: str) -> str:
        key, value = key.strip(), value.strip()
        if not key or any(c in key for c in "=\n\r") or any(c in value for c in "\n\r"):
            raise ClientError("a config key is one word without '=' and the value one line")
        if broker_addr not in {b.addr for b in await self.admin.brokers()}:
            raise ClientError(f"no broker {broker_addr} is registered with the name server")
        persisted = await ops.update_broker_config(self.admin, broker_addr, {key: value})
        return f"{key}={value} set on {broker_addr}" + (f" (written to {persisted})" if persisted else "")

    async def elect(self, broker_name: str, broker_id: int | None) -> str:
        controller = await self.data.controller()
        if controller is None:
            raise ClientError("no controller is known: start the console with --controller, or run the brokers "
                              "in controller mode")
        try:
            result = await controller.elect(broker_name, broker_id)
        finally:
            await controller.close()
        return (f"{broker_name}: master is replica {result.get('masterId', '?')} at "
                f"{result.get('masterAddr', '?')}, master epoch {result.get('masterEpoch', '?')}")
