"""Read a topic with the C++ client 2.1's PullConsumer (every queue from offset 0, the wrapper keeps the offsets
in memory and commits none) and record every message.

argv[1] JSON: namesrv, group, topic, expression (default "*"), out (JSON-lines path), expect_seqs (stop once
every one of these seqs was seen), timeout_s (give up), access_key/secret_key (ACL credentials; optional).
Each line: the fields of cpp_scripts/consume.py's delivery lines; the summary: {"met", "deliveries",
"distinct", "missing_count", "missing_head", "rounds"}.
"""

from __future__ import annotations

import time

from _cpp21 import CLIENT_VERSION, log_dir
from _cpp_common import SEQ_PROP, USER_PROP, JsonLines, args, hard_exit, now_ms, summary
from rocketmq.client import PullConsumer

#: pause between two passes over the queues once they are drained
IDLE_PAUSE_S = 0.2


def main() -> None:
    a = args()
    out = JsonLines(a.get("out"))
    expect = {int(s) for s in a.get("expect_seqs") or []}
    seen: set[int] = set()
    deliveries = rounds = 0
    consumer = PullConsumer(a["group"])
    consumer.set_log_root_path(log_dir())
    consumer.set_namesrv_addr(a["namesrv"])
    if a.get("access_key"):
        consumer.set_session_credentials(a["access_key"], a["secret_key"], "ALIYUN")
    consumer.start()
    deadline = time.monotonic() + float(a.get("timeout_s", 120))
    while time.monotonic() < deadline and not expect <= seen:
        rounds += 1
        got = 0
        for msg in consumer.pull(a["topic"], a.get("expression", "*")):
            raw_seq = msg.get_property(SEQ_PROP)
            seq = int(raw_seq) if raw_seq not in (None, b"", "") else -1
            out.write({"seq": seq, "topic": msg.topic, "body": _s(msg.body), "keys": _s(msg.keys),
                       "tags": _s(msg.tags), "prop": _s(msg.get_property(USER_PROP)), "msg_id": _s(msg.id),
                       "queue_id": int(msg.queue_id), "queue_offset": int(msg.queue_offset),
                       "reconsume_times": int(msg.reconsume_times), "born_ms": int(msg.born_timestamp),
                       "store_ms": int(msg.store_timestamp), "recv_ms": now_ms()})
            seen.add(seq)
            deliveries += 1
            got += 1
        if not got:
            time.sleep(IDLE_PAUSE_S)
    missing = sorted(expect - seen)
    out.close()
    summary({"met": not missing, "deliveries": deliveries, "distinct": len(seen), "missing_count": len(missing),
             "missing_head": missing[:20], "rounds": rounds, "client": CLIENT_VERSION})
    hard_exit(0)


def _s(v: object) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


if __name__ == "__main__":
    main()
