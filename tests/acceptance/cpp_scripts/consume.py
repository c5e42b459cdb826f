"""Consume with the C++ PushConsumer (clustering) and record every delivery.

argv[1] JSON: namesrv, group, topic, expression (default "*"), out (JSON-lines path),
expect_seqs (stop once every one of these seqs was seen; may be empty), stop_after (stop after this
many deliveries; optional), timeout_s (give up), settle_s (keep consuming this long after the stop
condition, to catch duplicates/unwanted tags; default 0), thread_count, delay_ms (sleep in the
callback per message, to slow consumption down; default 0).
Each delivery line: {"seq", "body", "keys", "tags", "prop", "msg_id", "queue_id", "queue_offset",
"reconsume_times", "born_ms", "store_ms", "recv_ms", "topic"}.
The summary says whether the stop condition was met; shutdown commits offsets (C++ persists on shutdown).
"""

from __future__ import annotations

import threading
import time

from _cpp_common import SEQ_PROP, USER_PROP, JsonLines, args, hard_exit, now_ms, summary
from rocketmq.client import PushConsumer

#: poll period of the main thread's stop-condition check
CHECK_INTERVAL_S = 0.05


def main() -> None:
    a = args()
    out = JsonLines(a.get("out"))
    expect = {int(s) for s in a.get("expect_seqs") or []}
    stop_after = a.get("stop_after")
    lock = threading.Lock()
    seen: set[int] = set()
    deliveries = [0]
    delay_s = float(a.get("delay_ms", 0)) / 1000

    def on_message(msg) -> None:  # runs on C++ consume threads
        raw_seq = msg.get_property(SEQ_PROP)
        seq = int(raw_seq) if raw_seq not in (None, b"", "") else -1
        rec = {
            "seq": seq,
            "topic": _s(msg.topic),
            "body": _s(msg.body),
            "keys": _s(msg.keys),
            "tags": _s(msg.tags),
            "prop": _s(msg.get_property(USER_PROP)),
            "msg_id": _s(msg.id),
            "queue_id": int(msg.queue_id),
            "queue_offset": int(msg.queue_offset),
            "reconsume_times": int(msg.reconsume_times),
            "born_ms": int(msg.born_timestamp),
            "store_ms": int(msg.store_timestamp),
            "recv_ms": now_ms(),
        }
        out.write(rec)
        with lock:
            seen.add(seq)
            deliveries[0] += 1
        if delay_s:
            time.sleep(delay_s)

    consumer = PushConsumer(a["group"])
    consumer.set_namesrv_addr(a["namesrv"])
    if a.get("thread_count"):
        consumer.set_thread_count(int(a["thread_count"]))
    consumer.subscribe(a["topic"], on_message, a.get("expression", "*"))
    consumer.start()
    deadline = time.monotonic() + float(a.get("timeout_s", 120))
    met = False
    while time.monotonic() < deadline:
        with lock:
            done_expect = bool(expect) and expect <= seen
            done_count = stop_after is not None and deliveries[0] >= int(stop_after)
        if done_expect or done_count:
            met = True
            break
        time.sleep(CHECK_INTERVAL_S)
    settle_until = time.monotonic() + float(a.get("settle_s", 0))
    while met and time.monotonic() < settle_until:
        time.sleep(CHECK_INTERVAL_S)
    with lock:
        missing = sorted(expect - seen)
        n = deliveries[0]
    consumer.shutdown()  # commits the consumed offsets
    out.close()
    summary({"met": met, "deliveries": n, "distinct": len(seen), "missing_count": len(missing),
             "missing_head": missing[:20]})
    hard_exit(0)


def _s(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


if __name__ == "__main__":
    main()
