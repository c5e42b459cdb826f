"""Send messages with the C++ client 2.1 (PyPI rocketmq-python-cvs) and record every outcome.

argv[1] JSON: namesrv, topic, group, count, prefix, tags (list), start (first seq, default 0), body_pad
(default 0), delay_level (default 0), mode, batch (messages per batch send, mode "batch"), shards (mode
"orderly": the sharding key of seq is seq % shards, and the client's hashing selector puts it on queue
key % queue count), max_inflight (mode "async", default 64), out (JSON-lines path), deadline_s (stop sending
after this), timeout_ms (client send timeout), access_key/secret_key (ACL credentials; optional).

mode: "sync" (send_sync, default), "async" (send_async: the outcome comes from a callback), "oneway"
(send_oneway: nothing comes back, the line says ok when the call returned), "orderly" (send_orderly with a
sharding key), "sharding_key" (the C API's SendMessageOrderlyByShardingKey, which the binding does not wrap,
with the key "key-<seq % shards>"; the client picks queue hash(key) % queue count), "batch" (send_batch).
Each outcome line: {"seq", "ok", "status", "msg_id", "offset", "send_start_ms", "send_end_ms"[, "error",
"shard"]}; the summary: {"sent_ok", "failed", "attempted", "client"}.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from _cpp21 import CLIENT_VERSION, new_producer
from _cpp_common import JsonLines, args, build_message, expected_message, hard_exit, now_ms, summary
from rocketmq.client import Message, SendResult, SendStatus
from rocketmq.exceptions import ffi_check
from rocketmq.ffi import _CSendResult, dll

MODES = ("sync", "async", "oneway", "orderly", "sharding_key", "batch")
#: async sends outstanding at once (default of max_inflight)
DEFAULT_MAX_INFLIGHT = 64


def build(topic: str, exp: dict[str, Any], delay_level: int) -> Message:
    return build_message(Message, topic, exp, delay_level)


def send_by_sharding_key(producer: Any, msg: Message, key: str) -> SendResult:
    send = dll.SendMessageOrderlyByShardingKey
    send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_CSendResult)]
    send.restype = ctypes.c_int
    cres = _CSendResult()
    ffi_check(send(producer._handle, msg._handle, key.encode(), ctypes.pointer(cres)))
    return SendResult(SendStatus(cres.sendStatus), cres.msgId.decode("utf-8"), cres.offset)


def main() -> None:
    a = args()
    mode = a.get("mode", "sync")
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {MODES}, got {mode!r}")
    out = JsonLines(a.get("out"))
    tags = list(a.get("tags") or ["TagA"])
    start = int(a.get("start", 0))
    count = int(a["count"])
    batch = int(a.get("batch", 10)) if mode == "batch" else 1
    shards = int(a.get("shards", 1))
    deadline = time.monotonic() + float(a.get("deadline_s", 300))
    producer = new_producer(a["group"])
    producer.set_namesrv_addr(a["namesrv"])
    if a.get("timeout_ms"):
        producer.set_timeout(int(a["timeout_ms"]))
    if a.get("access_key"):
        producer.set_session_credentials(a["access_key"], a["secret_key"], "ALIYUN")
    producer.start()
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    inflight = threading.BoundedSemaphore(int(a.get("max_inflight", DEFAULT_MAX_INFLIGHT)))
    pending = [0]
    msgs_alive: dict[int, Message] = {}  # async: the message stays referenced until its callback

    def record(seqs: list[int], ok: bool, t0: int, **fields: Any) -> None:
        t1 = now_ms()
        for s in seqs:
            line = {"seq": s, "ok": ok, "send_start_ms": t0, "send_end_ms": t1, **fields}
            if mode in ("orderly", "sharding_key"):
                line["shard"] = s % shards
            out.write(line)
        with lock:
            counts["ok" if ok else "failed"] += len(seqs)

    def result_fields(res: Any) -> dict[str, Any]:
        return {"status": int(res.status), "msg_id": res.msg_id, "offset": int(res.offset)}

    seq = start
    while seq < start + count and time.monotonic() < deadline:
        seqs = list(range(seq, min(seq + batch, start + count)))
        exps = [expected_message(a["prefix"], s, tags, int(a.get("body_pad", 0))) for s in seqs]
        msgs = [build(a["topic"], e, int(a.get("delay_level", 0))) for e in exps]
        t0 = now_ms()
        if mode == "async":
            inflight.acquire()
            with lock:
                pending[0] += 1
                msgs_alive[seq] = msgs[0]

            def done(s: int = seq, t: int = t0) -> None:
                with lock:
                    pending[0] -= 1
                    msgs_alive.pop(s, None)
                inflight.release()

            def on_ok(res: Any, s: int = seq, t: int = t0) -> None:
                record([s], res.status == SendStatus.OK, t, **result_fields(res))
                done(s)

            def on_error(exc: Exception, s: int = seq, t: int = t0) -> None:
                record([s], False, t, error=f"{type(exc).__name__}: {exc}")
                done(s)

            try:
                producer.send_async(msgs[0], on_ok, on_error)
            except Exception as exc:  # refused before it was sent
                on_error(exc)
            seq += 1
            continue
        try:
            if mode == "batch":
                res = producer.send_batch(msgs)
            elif mode == "orderly":
                res = producer.send_orderly(msgs[0], seq % shards)
            elif mode == "sharding_key":
                res = send_by_sharding_key(producer, msgs[0], f"key-{seq % shards}")
            elif mode == "oneway":
                producer.send_oneway(msgs[0])
                res = None
            else:
                res = producer.send_sync(msgs[0])
        except Exception as exc:  # the client raises on any failed send
            record(seqs, False, t0, error=f"{type(exc).__name__}: {exc}")
        else:
            if res is None:
                record(seqs, True, t0)
            else:
                record(seqs, res.status == SendStatus.OK, t0, **result_fields(res))
        seq += len(seqs)
    while mode == "async" and time.monotonic() < deadline:
        with lock:
            if pending[0] == 0:
                break
        time.sleep(0.05)
    with lock:
        unanswered = pending[0]
    out.close()
    summary({"sent_ok": counts["ok"], "failed": counts["failed"], "attempted": seq - start,
             "unanswered": unanswered, "client": CLIENT_VERSION})
    try:
        producer.shutdown()
    finally:
        hard_exit(0)


if __name__ == "__main__":
    main()
