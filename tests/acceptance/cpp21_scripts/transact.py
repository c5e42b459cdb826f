"""Transactional sends with the C++ client 2.1 through its C API (CreateTransactionProducer,
SendMessageTransaction; the binding wraps neither), answering the broker's check-backs.

argv[1] JSON: namesrv, topic, group, count, prefix, tags, start (default 0), out (JSON-lines path), linger_s
(after the last send, keep the producer up until every UNKNOWN one was checked back, at most this long;
default 0).
The local transaction of seq decides by seq % 3: 0 commits, 1 rolls back, 2 answers UNKNOWN and the check-back
commits. Lines: {"seq", "ok", "status", "msg_id", "local", "send_start_ms", "send_end_ms"[, "error"]} per send
and {"check": seq, "at_ms"} per check-back; the summary: {"sent_ok", "failed", "attempted", "checks", "client"}.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from _cpp21 import CLIENT_VERSION, log_dir
from _cpp_common import SEQ_PROP, USER_PROP, JsonLines, args, expected_message, hard_exit, now_ms, summary
from rocketmq.client import Message, SendStatus
from rocketmq.exceptions import ffi_check
from rocketmq.ffi import _CSendResult, dll

#: CTransactionStatus (include/CTransactionStatus.h)
COMMIT, ROLLBACK, UNKNOWN = 0, 1, 2
#: the local transaction's answer by seq % 3
LOCAL_ANSWER = {0: COMMIT, 1: ROLLBACK, 2: UNKNOWN}
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def main() -> None:
    a = args()
    out = JsonLines(a.get("out"))
    tags = list(a.get("tags") or ["TagA"])
    start = int(a.get("start", 0))
    count = int(a["count"])
    checks = [0]
    lock = threading.Lock()

    def seq_of(msg: int) -> int:
        raw = dll.GetMessageProperty(msg, SEQ_PROP.encode())
        return int(raw) if raw else -1

    def on_check(_producer: int, msg: int, _data: int) -> int:  # the broker asks about an UNKNOWN one
        seq = seq_of(msg)
        out.write({"check": seq, "at_ms": now_ms()})
        with lock:
            checks[0] += 1
        return COMMIT if seq % 3 == 2 else ROLLBACK

    def on_execute(_producer: int, msg: int, _data: int) -> int:
        return LOCAL_ANSWER[seq_of(msg) % 3]

    checker, executor = CALLBACK(on_check), CALLBACK(on_execute)
    create = dll.CreateTransactionProducer
    create.argtypes = [ctypes.c_char_p, CALLBACK, ctypes.c_void_p]
    create.restype = ctypes.c_void_p
    producer = create(a["group"].encode(), checker, None)
    dll.SetProducerLogPath.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ffi_check(dll.SetProducerLogPath(producer, log_dir().encode()))
    ffi_check(dll.SetProducerNameServerAddress(producer, a["namesrv"].encode()))
    ffi_check(dll.StartProducer(producer))
    send = dll.SendMessageTransaction
    send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, CALLBACK, ctypes.c_void_p, ctypes.POINTER(_CSendResult)]
    send.restype = ctypes.c_int
    ok = failed = 0
    for seq in range(start, start + count):
        exp = expected_message(a["prefix"], seq, tags)
        msg = Message(a["topic"])
        msg.set_keys(exp["keys"])
        msg.set_tags(exp["tags"])
        msg.set_body(exp["body"])
        msg.set_property(SEQ_PROP, str(seq))
        msg.set_property(USER_PROP, exp["prop"])
        cres = _CSendResult()
        t0 = now_ms()
        line: dict[str, Any] = {"seq": seq, "local": LOCAL_ANSWER[seq % 3], "send_start_ms": t0}
        try:
            ffi_check(send(producer, msg._handle, executor, None, ctypes.pointer(cres)))
        except Exception as exc:
            line.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            failed += 1
        else:
            status_ok = cres.sendStatus == SendStatus.OK
            line.update(ok=status_ok, status=int(cres.sendStatus), msg_id=cres.msgId.decode())
            ok += status_ok
            failed += not status_ok
        line["send_end_ms"] = now_ms()
        out.write(line)
    unknown = sum(1 for seq in range(start, start + count) if LOCAL_ANSWER[seq % 3] == UNKNOWN)
    linger_until = time.monotonic() + float(a.get("linger_s", 0))
    while time.monotonic() < linger_until:
        with lock:
            if checks[0] >= unknown:
                break
        time.sleep(0.05)
    with lock:
        n_checks = checks[0]
    out.close()
    summary({"sent_ok": ok, "failed": failed, "attempted": count, "checks": n_checks, "client": CLIENT_VERSION})
    hard_exit(0)


if __name__ == "__main__":
    main()
