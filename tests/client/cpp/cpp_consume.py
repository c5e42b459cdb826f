"""Consume with the Apache C++ PushConsumer until ``count`` messages arrived. argv[1] JSON: namesrv, topic,
group, count, timeout_s. Prints one JSON line per message: {"body", "keys", "tags", "prop", "msg_id"}."""

import json
import os
import sys
import threading
import time

from rocketmq.client import PushConsumer


def main() -> None:
    a = json.loads(sys.argv[1])
    lock = threading.Lock()
    seen: list[str] = []

    def on_message(msg):  # type: ignore[no-untyped-def]
        def s(v):  # type: ignore[no-untyped-def]
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")
        rec = {"body": s(msg.body), "keys": s(msg.keys), "tags": s(msg.tags), "prop": s(msg.get_property("myprop")),
               "msg_id": s(msg.id)}
        with lock:
            if rec["body"] not in seen:
                seen.append(rec["body"])
                print(json.dumps(rec), flush=True)
        return None  # returning normally = CONSUME_SUCCESS in 0.4.4

    consumer = PushConsumer(a["group"])
    consumer.set_namesrv_addr(a["namesrv"])
    consumer.subscribe(a["topic"], on_message)
    consumer.start()
    deadline = time.monotonic() + float(a.get("timeout_s", 60))
    while time.monotonic() < deadline:
        with lock:
            if len(seen) >= int(a["count"]):
                break
        time.sleep(0.05)
    consumer.shutdown()
    sys.stdout.flush()
    os._exit(0 if len(seen) >= int(a["count"]) else 3)


if __name__ == "__main__":
    main()
