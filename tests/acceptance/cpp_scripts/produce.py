"""Send messages with the C++ client (PyPI rocketmq==0.4.4) and record every outcome.

argv[1] JSON: namesrv, topic, group, count, prefix, tags (list), start (first seq, default 0),
body_pad (default 0), delay_level (default 0), batch (messages per send_batch; 0 = send_sync),
out (JSON-lines path), deadline_s (stop sending after this), timeout_ms (client send timeout),
access_key/secret_key (ACL credentials: set_session_credentials; optional).
Each outcome line: {"seq", "ok", "status", "msg_id", "offset", "send_start_ms", "send_end_ms"[, "error"]}.
"""

from __future__ import annotations

import time

from _cpp_common import JsonLines, args, build_message, expected_message, hard_exit, now_ms, summary
from rocketmq.client import Message, Producer, SendStatus


def build(topic: str, exp: dict, delay_level: int) -> Message:
    return build_message(Message, topic, exp, delay_level)


def main() -> None:
    a = args()
    out = JsonLines(a.get("out"))
    tags = list(a.get("tags") or ["TagA"])
    start = int(a.get("start", 0))
    count = int(a["count"])
    batch = int(a.get("batch", 0))
    deadline = time.monotonic() + float(a.get("deadline_s", 300))
    producer = Producer(a["group"])
    producer.set_namesrv_addr(a["namesrv"])
    if a.get("timeout_ms"):
        producer.set_timeout(int(a["timeout_ms"]))
    if a.get("access_key"):
        producer.set_session_credentials(a["access_key"], a["secret_key"], "ALIYUN")
    producer.start()
    ok = failed = 0
    seq = start
    while seq < start + count and time.monotonic() < deadline:
        n = max(1, batch)
        seqs = list(range(seq, min(seq + n, start + count)))
        exps = [expected_message(a["prefix"], s, tags, int(a.get("body_pad", 0))) for s in seqs]
        msgs = [build(a["topic"], e, int(a.get("delay_level", 0))) for e in exps]
        t0 = now_ms()
        try:
            res = producer.send_batch(msgs) if batch else producer.send_sync(msgs[0])
        except Exception as exc:  # the C++ client raises on any failed send
            t1 = now_ms()
            for s in seqs:
                out.write({"seq": s, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                           "send_start_ms": t0, "send_end_ms": t1})
            failed += len(seqs)
        else:
            t1 = now_ms()
            status_ok = res.status == SendStatus.OK
            for s in seqs:
                out.write({"seq": s, "ok": status_ok, "status": int(res.status), "msg_id": res.msg_id,
                           "offset": int(res.offset), "send_start_ms": t0, "send_end_ms": t1})
            if status_ok:
                ok += len(seqs)
            else:
                failed += len(seqs)
        seq += len(seqs)
    out.close()
    summary({"sent_ok": ok, "failed": failed, "attempted": seq - start})
    try:
        producer.shutdown()
    finally:
        hard_exit(0)


if __name__ == "__main__":
    main()
