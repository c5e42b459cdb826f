"""Two in-process brokers, one on the store's native path and one on the pure-Python path, fed the same
requests through ``SendProcessor`` (no sockets, no threads): the equivalence tests of the native send
paths compare their answers and stored files."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import ferrymq.broker.app as app_mod
from ferrymq.broker.app import BrokerController
from ferrymq.common.message import host_to_bytes
from ferrymq.remoting.codec import FrameDecoder, RemotingCommand
from ferrymq.store.segment_warmer import PREPARED_SUFFIX
from support.inproc import broker_config
from support.native import require_extension

STORE_CONFIG_OF = app_mod.store_config_of
START_MS = 1_700_000_000_000
SEGMENT = 8 * 1024  # small commit log segments: sends roll over (BLANK filler) often
MAX_PROPERTIES = 160  # small enough that properties go over it now and then
MAX_MESSAGE = 6000  # small enough that a body goes over it now and then


class StepClock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        self.now += 1
        return self.now


def small_store_config(cfg: Any) -> Any:
    """The broker's store config with a small properties limit and small index files (the default maps ~420 MB)."""
    sc = STORE_CONFIG_OF(cfg)
    sc.max_properties_size = MAX_PROPERTIES
    sc.index_hash_slot_num = 64
    sc.index_max_num = 256
    return sc


@contextlib.contextmanager
def brokers(cluster: str, sync_flush: bool = False) -> Iterator[tuple[BrokerController, BrokerController]]:
    """(native, pure) controllers, started far enough for SendProcessor.handle (no sockets, no threads)."""
    ext = require_extension()
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ferrymq-twins-") as tmp:
        made: list[BrokerController] = []
        try:
            for name, native in (("native", True), ("pure", False)):
                cfg = broker_config(str(Path(tmp) / name), broker_name="b", broker_cluster_name=cluster,
                                    mapped_file_size_commit_log=SEGMENT, max_message_size=MAX_MESSAGE,
                                    mapped_file_size_consume_queue=20 * 200)
                with mock.patch.object(app_mod, "store_config_of", small_store_config):
                    ctl = BrokerController(cfg, clock_ms=StepClock())
                ctl.topics.load()
                ctl.groups.load()
                ctl.store.load()
                ctl.writer.bind(loop)
                ctl.writer.sync_flush = sync_flush
                ctl.store_host = host_to_bytes("127.0.0.1", 10911)
                log = ctl.store.commit_log
                log.native = ext if native else None
                log.queue_metas = not native
                ctl.store.dispatcher.native = ext if native else None
                ctl.writer.refresh_native()
                assert ctl.writer.native_put_one is native
                made.append(ctl)
            yield made[0], made[1]
        finally:
            for ctl in made:
                ctl.store.shutdown()
            loop.close()


class FakeConn:
    peer_addr = "10.1.2.3:45678"
    closed = False


def answer(ctl: BrokerController, cmd: RemotingCommand) -> tuple[Any, ...]:
    """(code, remark, extFields, body, opaque) of the processor's answer; ("wait",) for a flush wait."""
    proc = ctl.dispatcher.get(cmd.code)
    assert proc is not None
    resp = proc(FakeConn(), cmd)
    if asyncio.iscoroutine(resp):  # SYNC_FLUSH with WAIT != false: the flush wait (not run here)
        resp.close()
        return ("wait",)
    if isinstance(resp, bytes):  # the templated SEND_OK frame
        decoded = FrameDecoder().feed(resp)
        assert len(decoded) == 1
        resp = decoded[0]
    assert isinstance(resp, RemotingCommand)
    return resp.code, resp.remark, resp.ext_fields, resp.body, resp.opaque


def stored_files(ctl: BrokerController) -> dict[str, bytes]:
    """The store's files as the store reads them. A ``.prep`` file is the next commit log segment that the
    warmer thread is still zero-filling (not yet part of the log), so its bytes depend on the warmer's
    progress, not on what was stored: it is left out."""
    ctl.writer.reput_now()
    ctl.store.flush_consume_queues()
    root = Path(ctl.store.config.store_path_root_dir)
    out: dict[str, bytes] = {}
    for sub in ("commitlog", "consumequeue", "index"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and path.suffix != PREPARED_SUFFIX:
                out[str(path.relative_to(root))] = path.read_bytes()
    return out
