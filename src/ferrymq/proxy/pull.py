"""The 5.x pull consumer's RPCs (PullMessage, UpdateOffset, GetOffset, QueryOffset) and the answer to
SyncLiteSubscription, translated onto the brokers' remoting requests with the proxy's own client.

Unlike ReceiveMessage (pop consumption, pop.py), these keep no state in the proxy: the client names one
queue (``MessageQueue``: topic, broker name, queue id, as QueryRoute listed it) and a queue offset, and the
group's consumer offsets live on the brokers.

| RPC                  | remoting request(s)                                  | answer                          |
|----------------------|------------------------------------------------------|---------------------------------|
| PullMessage          | PULL_MESSAGE from ``offset`` (a queue offset), at    | a stream: status, then each     |
|                      | most ``batch_size`` (MAX_PULL_BATCH), broker long    | message, then ``next_offset``   |
|                      | poll of ``long_polling_timeout`` (within the call's  | (the queue offset to pull next) |
|                      | deadline); tag or SQL92 filter as ReceiveMessage     |                                 |
| UpdateOffset         | UPDATE_CONSUMER_OFFSET (group, queue, ``offset``)    | status                          |
| GetOffset            | QUERY_CONSUMER_OFFSET (group, queue)                 | status, ``offset``              |
| QueryOffset          | BEGINNING: GET_MIN_OFFSET; END: GET_MAX_OFFSET;      | status, ``offset``              |
|                      | TIMESTAMP: SEARCH_OFFSET_BY_TIMESTAMP (``timestamp``)|                                 |
| SyncLiteSubscription | none: ferrymq has no lite topics                     | status NOT_IMPLEMENTED          |

PullMessage statuses (as RocketMQ's proxy): messages found: OK; none (nothing new, or every one filtered
out): MESSAGE_NOT_FOUND; an offset outside the queue: ILLEGAL_OFFSET with ``next_offset`` where the queue's
messages are. A failure (broker unreachable, unknown topic) is one status and no ``next_offset``. GetOffset
of a group that never committed an offset on the queue is OFFSET_NOT_FOUND.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ferrymq.client.consumer.core import ConsumerCore
from ferrymq.client.instance import ClientInstance
from ferrymq.client.values import PullStatus
from ferrymq.common.route import MessageQueue as RemotingQueue
from ferrymq.errors import TopicNotExistError
from ferrymq.proxy import translate as tr
from ferrymq.proxy.v2 import definition_pb2 as pb
from ferrymq.proxy.v2 import service_pb2 as spb
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

#: the largest PullMessage batch (also the batch of a request that names none; the broker's own bound on
#: one pull is RocketMQ's maxTransferCountOnMessageInMemory, 32)
MAX_PULL_BATCH = 32
#: the part of the gRPC deadline kept free for the answer to travel back
PULL_DEADLINE_MARGIN_MS = 1_000
#: remoting request timeout beyond the broker's long poll
PULL_REMOTING_TIMEOUT_MS = 5_000
#: QueryOffset policy -> the remoting request answering it
OFFSET_QUERY_CODE = {pb.BEGINNING: RequestCode.GET_MIN_OFFSET, pb.END: RequestCode.GET_MAX_OFFSET,
                     pb.TIMESTAMP: RequestCode.SEARCH_OFFSET_BY_TIMESTAMP}
#: the message SyncLiteSubscription answers with its NOT_IMPLEMENTED status
LITE_TOPICS_UNSUPPORTED = "lite topics are not supported by ferrymq (SyncLiteSubscription)"


class PullRpcs:
    """The pull consumer's RPCs, mixed into ``service.MessagingService`` (which provides the members
    declared under TYPE_CHECKING)."""

    if TYPE_CHECKING:
        instance: ClientInstance

        def _denied(self, rpc: str, request: Any, context: Any) -> pb.Status | None: ...

        def _core(self, group: str) -> ConsumerCore: ...

        def _hooks(self, group: str) -> Any: ...

    # ---- helpers -----------------------------------------------------------------------------------------
    async def _pull_queue(self, message_queue: pb.MessageQueue) -> RemotingQueue:
        """The remoting queue a request names, checked against the topic's route."""
        topic, broker_name, queue_id = message_queue.topic.name, message_queue.broker.name, message_queue.id
        if not topic:
            raise tr.TranslateError(pb.ILLEGAL_TOPIC, "topic is empty")
        try:
            route = await self.instance.get_route(topic)
        except TopicNotExistError as exc:
            raise tr.TranslateError(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist") from exc
        queue_data = next((q for q in route.queue_datas if q.broker_name == broker_name), None)
        if queue_data is None:
            raise tr.TranslateError(pb.BAD_REQUEST, f"topic {topic} has no queue on broker {broker_name!r}")
        if not 0 <= queue_id < max(queue_data.read_queue_nums, queue_data.write_queue_nums):
            raise tr.TranslateError(pb.BAD_REQUEST, f"topic {topic} has no queue {queue_id} on broker {broker_name}")
        return RemotingQueue(topic, broker_name, queue_id)

    @staticmethod
    def _group_of(request: Any) -> str:
        group = str(request.group.name)
        if not group:
            raise tr.TranslateError(pb.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        return group

    # ---- PullMessage ---------------------------------------------------------------------------------------
    async def PullMessage(self, request: spb.PullMessageRequest,
                          context: Any) -> AsyncIterator[spb.PullMessageResponse]:
        denied = self._denied("PullMessage", request, context)
        if denied is not None:
            yield spb.PullMessageResponse(status=denied)
            return
        try:
            group = self._group_of(request)
            mq = await self._pull_queue(request.message_queue)
            if request.offset < 0:
                raise tr.TranslateError(pb.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
            if request.batch_size < 0:
                raise tr.TranslateError(pb.BAD_REQUEST, f"batch size {request.batch_size} < 0")
            batch = min(request.batch_size or MAX_PULL_BATCH, MAX_PULL_BATCH)
            poll_ms = tr.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            if poll_ms < 0:
                raise tr.TranslateError(pb.ILLEGAL_POLLING_TIME, "long polling timeout < 0")
            remaining = context.time_remaining()
            if remaining is not None:
                poll_ms = min(poll_ms, max(0, int(remaining * 1000) - PULL_DEADLINE_MARGIN_MS))
            expression = tr.filter_of(request.filter_expression if request.HasField("filter_expression") else None)
            self._hooks(group).topics.setdefault(mq.topic, expression)
            result = await self._core(group).pull(
                mq, request.offset, batch, sub_expression=expression[0], expression_type=expression[1],
                block=poll_ms > 0, suspend_timeout_ms=poll_ms, timeout_ms=poll_ms + PULL_REMOTING_TIMEOUT_MS)
        except Exception as exc:
            log.debug("pull of %s failed: %s", request.message_queue.topic.name, exc)
            yield spb.PullMessageResponse(status=tr.status_of_error(exc))
            return
        if result.status is PullStatus.FOUND and result.messages:
            yield spb.PullMessageResponse(status=tr.status())
            for msg in result.messages:
                response = spb.PullMessageResponse()
                tr.to_grpc_message(msg, into=response.message)
                yield response
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            yield spb.PullMessageResponse(status=tr.status(
                pb.ILLEGAL_OFFSET, f"offset {request.offset} is outside the queue [{result.min_offset}, "
                                   f"{result.max_offset}]"))
        else:
            yield spb.PullMessageResponse(status=tr.status(pb.MESSAGE_NOT_FOUND, "no new message"))
        yield spb.PullMessageResponse(next_offset=result.next_begin_offset)

    # ---- offsets -------------------------------------------------------------------------------------------
    async def UpdateOffset(self, request: spb.UpdateOffsetRequest, context: Any) -> spb.UpdateOffsetResponse:
        denied = self._denied("UpdateOffset", request, context)
        if denied is not None:
            return spb.UpdateOffsetResponse(status=denied)
        try:
            group = self._group_of(request)
            mq = await self._pull_queue(request.message_queue)
            if request.offset < 0:
                raise tr.TranslateError(pb.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
            await self._core(group).commit_offset(mq, request.offset)
        except Exception as exc:
            return spb.UpdateOffsetResponse(status=tr.status_of_error(exc))
        return spb.UpdateOffsetResponse(status=tr.status())

    async def GetOffset(self, request: spb.GetOffsetRequest, context: Any) -> spb.GetOffsetResponse:
        denied = self._denied("GetOffset", request, context)
        if denied is not None:
            return spb.GetOffsetResponse(status=denied)
        try:
            group = self._group_of(request)
            mq = await self._pull_queue(request.message_queue)
            queue_offset = await self._core(group).fetch_committed_offset(mq)
            if queue_offset < 0:
                raise tr.TranslateError(pb.OFFSET_NOT_FOUND, f"group {group} has no committed offset on queue "
                                                             f"{mq.queue_id} of {mq.topic} on {mq.broker_name}")
        except Exception as exc:
            return spb.GetOffsetResponse(status=tr.status_of_error(exc))
        return spb.GetOffsetResponse(status=tr.status(), offset=queue_offset)

    async def QueryOffset(self, request: spb.QueryOffsetRequest, context: Any) -> spb.QueryOffsetResponse:
        denied = self._denied("QueryOffset", request, context)
        if denied is not None:
            return spb.QueryOffsetResponse(status=denied)
        try:
            mq = await self._pull_queue(request.message_queue)
            code = OFFSET_QUERY_CODE.get(request.query_offset_policy)
            if code is None:
                raise tr.TranslateError(pb.BAD_REQUEST, f"unknown query offset policy {request.query_offset_policy}")
            extra: dict[str, Any] = {}
            if code == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise tr.TranslateError(pb.BAD_REQUEST, "policy TIMESTAMP needs a timestamp")
                extra["timestamp"] = tr.timestamp_ms(request.timestamp)
            # the queue's offsets, not a group's: a core of no group asks
            queue_offset = await ConsumerCore(self.instance, "").query_offset(code, mq, **extra)
        except Exception as exc:
            return spb.QueryOffsetResponse(status=tr.status_of_error(exc))
        return spb.QueryOffsetResponse(status=tr.status(), offset=queue_offset)

    # ---- SyncLiteSubscription ------------------------------------------------------------------------------
    async def SyncLiteSubscription(self, request: spb.SyncLiteSubscriptionRequest,
                                   context: Any) -> spb.SyncLiteSubscriptionResponse:
        """Lite topics do not exist here: a v2 status the SDK reports as it is (the bare gRPC UNIMPLEMENTED
        reads as a transport failure)."""
        denied = self._denied("SyncLiteSubscription", request, context)
        if denied is not None:
            return spb.SyncLiteSubscriptionResponse(status=denied)
        return spb.SyncLiteSubscriptionResponse(status=tr.status(pb.NOT_IMPLEMENTED, LITE_TOPICS_UNSUPPORTED))
