"""``CommitLog.put_one_raw``'s written-out fast path: the result objects it builds without ``__init__`` equal the
dataclass-built ones field for field, and it declines (None: the Python path answers) exactly when
``MessageStore.put_one_raw`` used to — store not running, slave, no extension, queued metas."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest
from store_helpers import CL_SEGMENT, inner

from ferrymq.common.message import encode_offset_msg_id_raw
from ferrymq.store import MessageStore, PutMessageStatus
from ferrymq.store.results import AppendMessageResult, AppendMessageStatus, PutMessageResult
from support.native import require_extension

Opener = Callable[..., MessageStore]
HOST = bytes([127, 0, 0, 1, 0, 0, 0x2A, 0x9F])


def put1(store: MessageStore, queue_id: int = 0, body: bytes = b"body", props: bytes = b"TAGS\x01t") -> object:
    return store.put_one_raw("TopicA", queue_id, body, props, b"C", 0, 0, 1, HOST, HOST, 0)


def native_store(open_store: Opener, **overrides: object) -> MessageStore:
    store = open_store(**overrides)
    store.commit_log.native = require_extension()
    store.commit_log.queue_metas = False
    store.dispatcher.native = store.commit_log.native
    return store


def test_fast_path_results_equal_the_dataclass_ones(open_store: Opener) -> None:
    store = native_store(open_store)
    for i in range(3):
        before = store.max_phy_offset
        out = put1(store, queue_id=i % 2)
        assert isinstance(out, tuple)
        result, wait = out
        assert wait is True
        ar = result.append_result
        total = store.max_phy_offset - before
        want_ar = AppendMessageResult(AppendMessageStatus.PUT_OK, before, total, store.commit_log.last_store_timestamp,
                                      i // 2, 1, HOST, (), encode_offset_msg_id_raw(HOST, before))
        assert ar == want_ar and repr(ar) == repr(want_ar)
        for f in dataclasses.fields(AppendMessageResult):  # every field set (a new field must be set there too)
            assert getattr(ar, f.name) == getattr(want_ar, f.name), f.name
        assert result == PutMessageResult(PutMessageStatus.PUT_OK, want_ar) and result.is_ok()
        assert ar.msg_id == encode_offset_msg_id_raw(HOST, before) and ar.msg_ids == [ar.msg_id]


def test_rolls_to_the_next_segment_with_the_same_results(open_store: Opener) -> None:
    store = native_store(open_store)
    body = b"z" * 3000
    seen = []
    while len(store.commit_log.mfq.files) < 3:
        out = put1(store, body=body)
        assert isinstance(out, tuple)
        ar = out[0].append_result
        seen.append(ar.wrote_offset)
        assert ar.wrote_offset + ar.wrote_bytes == store.max_phy_offset
        assert ar.wrote_offset // CL_SEGMENT == (store.max_phy_offset - 1) // CL_SEGMENT  # never spans segments
    assert [o for o in seen if o % CL_SEGMENT == 0] == [0, CL_SEGMENT, 2 * CL_SEGMENT]


def test_declines_when_not_running_or_slave(open_store: Opener) -> None:
    store = native_store(open_store)
    assert put1(store) is not None
    store.shutdown()
    assert store.commit_log.accepting_puts is False
    assert put1(store) is None and store.commit_log.put_one_raw("TopicA", 0, b"b", b"", b"C", 0, 0, 1, HOST, HOST,
                                                                 0) is None
    assert store.put_message(inner()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE

    unloaded = MessageStore(store.config)
    assert unloaded.commit_log.accepting_puts is False  # until load()

    slave = native_store(open_store, name="slave", broker_role="SLAVE")
    assert slave.commit_log.accepting_puts is True and put1(slave) is None
    assert slave.max_phy_offset == 0

    crashed = native_store(open_store, name="crashed")
    crashed.close_abruptly()
    assert put1(crashed) is None


@pytest.mark.parametrize("switch", ["native", "queue_metas"])
def test_declines_without_the_extension_or_with_queued_metas(open_store: Opener, switch: str) -> None:
    store = native_store(open_store)
    if switch == "native":
        store.commit_log.native = None
    else:
        store.commit_log.queue_metas = True
    assert put1(store) is None and store.max_phy_offset == 0


def test_writer_puts_through_the_commit_log_and_declines_like_the_store(open_store: Opener) -> None:
    from ferrymq.broker.config import BrokerConfig  # noqa: PLC0415
    from ferrymq.broker.flush import FlushService  # noqa: PLC0415
    from ferrymq.broker.writer import MessageWriter  # noqa: PLC0415

    store = native_store(open_store)
    dispatched: list[object] = []
    writer = MessageWriter(store, BrokerConfig(store_path_root_dir=store.config.store_path_root_dir),
                           FlushService(store, sync_flush=False, interval_ms=500), dispatched.append)
    assert writer.native_put_one

    async def run() -> None:
        writer.bind(asyncio.get_running_loop())
        out = writer.put_one_raw("TopicA", 3, b"x", b"WAIT\x01false", b"C", 0, 0, 1, HOST, HOST, 0)
        assert out is not None and out[1] is False and out[0].append_result.queue_offset == 0
        await asyncio.sleep(0)  # the scheduled reput runs
        assert dispatched == [{("TopicA", 3)}]
        assert store.get_max_offset_in_queue("TopicA", 3) == 1
        store.shutdown()
        assert writer.put_one_raw("TopicA", 3, b"x", b"", b"C", 0, 0, 1, HOST, HOST, 0) is None

    asyncio.run(run())
