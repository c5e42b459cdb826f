"""What each request processor may touch of the broker: one ``typing.Protocol`` per processor.

A processor's constructor takes its context below, never the whole ``BrokerController``; the controller
(``broker/app.py``) satisfies every one of them structurally, which mypy checks where it constructs the
processors. This module imports the broker's parts, never ``broker/app.py`` nor a processor, so the
processors do not import the controller back (``tests/test_tidy.py`` checks that).

Each context is made of one-member parts, all read-only (a processor calls the parts it is given, it does
not replace them):

| part                | member               | type                               |
|---------------------|----------------------|------------------------------------|
| ``HasConfig``       | ``config``           | ``BrokerConfig``                   |
| ``HasClock``        | ``clock_ms``         | ``() -> int`` (ms)                 |
| ``HasTopics``       | ``topics``           | ``TopicManager``                   |
| ``HasGroups``       | ``groups``           | ``SubscriptionGroupManager``       |
| ``HasOffsets``      | ``offsets``          | ``ConsumerOffsetManager``          |
| ``HasStore``        | ``store``            | ``MessageStore``                   |
| ``HasWriter``       | ``writer``           | ``MessageWriter``                  |
| ``HasStats``        | ``stats``            | ``BrokerStats``                    |
| ``HasConsumers``    | ``consumers``        | ``ConsumerManager``                |
| ``HasProducers``    | ``producers``        | ``ProducerManager``                |
| ``HasLongPolling``  | ``long_polling``     | ``PullRequestHoldService``         |
| ``HasTransactions`` | ``transactions``     | ``TransactionService``             |
| ``HasSchedule``     | ``schedule``         | ``ScheduleMessageService``         |
| ``HasDelayLevels``  | ``schedule_max_level``, ``wake_schedule()`` | ``int``, ``() -> None`` |
| ``HasTimer``        | ``timer``            | ``TimerMessageService``            |
| ``HasAclGuard``     | ``acl_guard``        | ``AclGuard | None`` (None: aclEnable false) |
| ``HasControllerRole`` | ``controller_role`` | ``WriteLease | None`` (None: classic mode) |
| ``HasEpochSource``  | ``controller_role``  | ``EpochSource | None`` (its ``epoch_file``; None: classic mode) |
| ``HasBrokerAddr``   | ``broker_addr``      | ``str`` (ip:port)                  |
| ``HasPort``         | ``port``             | ``int`` (the listening port)       |
| ``HasStoreHost``    | ``store_host``       | ``bytes`` (the records' store host) |
| ``HasHotDataBytes`` | ``hot_data_bytes``   | ``int`` (bytes behind the head still "in memory") |
| ``HasRuntimeInfo``  | ``runtime_info()``   | ``() -> dict[str, str]``           |
| ``HasRegistrar``    | ``registrar``        | ``NameServerRegistrar | None`` (None: not started) |
| ``HasStoreConfig``  | ``store_config``     | ``StoreConfig``                    |
| ``HasFlushService`` | ``flush_service``    | ``FlushService``                   |

A handler that needs another part adds it to its processor's context here (and the controller already has
it, or mypy says so at the construction in ``broker/app.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ferrymq.acl.guard import AclGuard
from ferrymq.broker.config import BrokerConfig
from ferrymq.broker.consumer_manager import ConsumerManager
from ferrymq.broker.flush import FlushService
from ferrymq.broker.long_polling import PullRequestHoldService
from ferrymq.broker.offset_manager import ConsumerOffsetManager
from ferrymq.broker.producer_manager import ProducerManager
from ferrymq.broker.queue_files import QueueFileGate
from ferrymq.broker.registration import NameServerRegistrar
from ferrymq.broker.schedule import ScheduleMessageService
from ferrymq.broker.stats import BrokerStats
from ferrymq.broker.subscription_manager import SubscriptionGroupManager
from ferrymq.broker.timer import TimerMessageService
from ferrymq.broker.topic_manager import TopicManager
from ferrymq.broker.transaction import TransactionService
from ferrymq.broker.writer import MessageWriter
from ferrymq.ha.epoch import EpochFile
from ferrymq.store.config import StoreConfig
from ferrymq.store.message_store import MessageStore

# ---- parts -----------------------------------------------------------------------------------------


class HasConfig(Protocol):
    @property
    def config(self) -> BrokerConfig: ...


class HasClock(Protocol):
    @property
    def clock_ms(self) -> Callable[[], int]: ...


class HasTopics(Protocol):
    @property
    def topics(self) -> TopicManager: ...


class HasGroups(Protocol):
    @property
    def groups(self) -> SubscriptionGroupManager: ...


class HasOffsets(Protocol):
    @property
    def offsets(self) -> ConsumerOffsetManager: ...


class HasStore(Protocol):
    @property
    def store(self) -> MessageStore: ...


class HasWriter(Protocol):
    @property
    def writer(self) -> MessageWriter: ...


class HasQueueFiles(Protocol):
    @property
    def queue_files(self) -> QueueFileGate: ...


class HasStats(Protocol):
    @property
    def stats(self) -> BrokerStats: ...


class HasConsumers(Protocol):
    @property
    def consumers(self) -> ConsumerManager: ...


class HasProducers(Protocol):
    @property
    def producers(self) -> ProducerManager: ...


class HasLongPolling(Protocol):
    @property
    def long_polling(self) -> PullRequestHoldService: ...


class HasTransactions(Protocol):
    @property
    def transactions(self) -> TransactionService: ...


class HasSchedule(Protocol):
    @property
    def schedule(self) -> ScheduleMessageService: ...


class HasTimer(Protocol):
    @property
    def timer(self) -> TimerMessageService: ...


class HasDelayLevels(Protocol):
    """The delay levels a DELAY message may ask for (1..schedule_max_level) and the schedule's wake-up."""

    @property
    def schedule_max_level(self) -> int: ...

    def wake_schedule(self) -> None: ...


class HasAclGuard(Protocol):
    @property
    def acl_guard(self) -> AclGuard | None: ...


class WriteLease(Protocol):
    """What a processor asks of the controller-mode role (``ControllerRole``) before it acknowledges a write."""

    def can_ack(self) -> bool: ...

    def refusal_remark(self) -> str: ...


class HasControllerRole(Protocol):
    @property
    def controller_role(self) -> WriteLease | None: ...


class EpochSource(Protocol):
    """What the epoch-cache query reads of the controller-mode role: its epoch file."""

    @property
    def epoch_file(self) -> EpochFile: ...


class HasEpochSource(Protocol):
    @property
    def controller_role(self) -> EpochSource | None: ...


class HasBrokerAddr(Protocol):
    @property
    def broker_addr(self) -> str: ...


class HasPort(Protocol):
    @property
    def port(self) -> int: ...


class HasStoreHost(Protocol):
    @property
    def store_host(self) -> bytes: ...


class HasHotDataBytes(Protocol):
    @property
    def hot_data_bytes(self) -> int: ...


class HasRuntimeInfo(Protocol):
    def runtime_info(self) -> dict[str, str]: ...


class HasRegistrar(Protocol):
    @property
    def registrar(self) -> NameServerRegistrar | None: ...


class HasStoreConfig(Protocol):
    @property
    def store_config(self) -> StoreConfig: ...


class HasFlushService(Protocol):
    @property
    def flush_service(self) -> FlushService: ...


# ---- one context per processor ---------------------------------------------------------------------


class SendContext(HasConfig, HasTopics, HasGroups, HasStore, HasWriter, HasStats, HasControllerRole, HasStoreHost,
                  HasDelayLevels, HasClock, HasQueueFiles, Protocol):
    """processors/send.py: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320)."""


class RecallContext(HasConfig, HasClock, HasTopics, HasWriter, HasTimer, HasControllerRole, HasStoreHost, Protocol):
    """processors/recall.py: RECALL_MESSAGE (370), GET_TIMER_CHECK_POINT (60)."""


class SendBackContext(HasConfig, HasTopics, HasGroups, HasStore, HasWriter, HasStats, HasDelayLevels, Protocol):
    """processors/send_back.py: CONSUMER_SEND_MSG_BACK (36)."""


class PullContext(HasConfig, HasTopics, HasGroups, HasOffsets, HasStore, HasStats, HasConsumers, HasLongPolling,
                  Protocol):
    """processors/pull.py: PULL_MESSAGE (11)."""


class ReplyContext(HasConfig, HasTopics, HasWriter, HasConsumers, HasProducers, HasControllerRole, HasPort,
                   HasStoreHost, Protocol):
    """processors/reply.py: SEND_REPLY_MESSAGE (324), SEND_REPLY_MESSAGE_V2 (325) →
    PUSH_REPLY_MESSAGE_TO_CLIENT (326)."""


class EndTransactionContext(HasConfig, HasTransactions, HasAclGuard, HasControllerRole, Protocol):
    """processors/end_transaction.py: END_TRANSACTION (37)."""


class ClientManageContext(HasConfig, HasTopics, HasGroups, HasConsumers, HasProducers, Protocol):
    """processors/client_manage.py: HEART_BEAT (34), UNREGISTER_CLIENT (35), CHECK_CLIENT_CONFIG (46)."""


class ClientQueryContext(HasConsumers, HasProducers, Protocol):
    """processors/client_query.py: questions about the clients, some answered by the clients themselves."""


class ConsumerManageContext(HasOffsets, HasStore, HasConsumers, HasHotDataBytes, Protocol):
    """processors/consumer_manage.py: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15),
    GET_CONSUMER_LIST_BY_GROUP (38)."""


class LockContext(HasClock, Protocol):
    """processors/lock.py: LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42) (the lock table is the processor's own)."""


class QueryContext(HasStore, Protocol):
    """processors/query.py: VIEW_MESSAGE_BY_ID (33), QUERY_MESSAGE (12)."""


class AdminContext(HasConfig, HasTopics, HasGroups, HasOffsets, HasStore, HasConsumers, HasSchedule, HasRuntimeInfo,
                   Protocol):
    """processors/admin.py: admin and metadata codes (topics, groups, offsets, runtime info)."""


class OpsContext(HasConfig, HasTopics, HasOffsets, HasStore, HasStats, HasConsumers, HasProducers, HasBrokerAddr,
                 Protocol):
    """processors/ops.py: operations codes (connections, consumption, offset reset and clone, cleanup, stats)."""


class EpochContext(HasConfig, HasStore, HasEpochSource, Protocol):
    pass


class AclAdminContext(HasConfig, HasAclGuard, HasBrokerAddr, Protocol):
    """processors/acl_admin.py: ACL management codes 50..54."""


class RuntimeConfigContext(HasConfig, HasClock, HasTopics, HasGroups, HasConsumers, HasProducers, HasTransactions,
                           HasRegistrar, HasStoreConfig, HasFlushService, Protocol):
    """broker/runtime_config.py and processors/broker_config.py: GET/UPDATE_BROKER_CONFIG (a runtime-safe key
    updates the part that reads it)."""
