"""Consume with a push consumer until COUNT messages arrived (or TIMEOUT seconds passed).

    python examples/push_consumer.py [NAMESRV] [TOPIC] [COUNT] [TIMEOUT]
"""

import asyncio
import os
import sys

from ferrymq.client import ConsumeStatus, MessageExt, PushConsumer


async def main(namesrv: str, topic: str, count: int, timeout_s: float) -> None:
    received = 0
    done = asyncio.Event()

    async def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        nonlocal received
        for m in msgs:
            received += 1
            print(f"got {m.body.decode()!r} tags={m.tags} keys={m.keys} queue={m.queue_id}@{m.queue_offset}")
        if received >= count:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(namesrv, "example-push-group", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic, "TagA || TagB")
    consumer.register_message_listener(on_messages)
    async with consumer:
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            sys.exit(f"only {received} of {count} messages within {timeout_s} s")
    print("received", received)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
                     sys.argv[2] if len(sys.argv) > 2 else "ExampleTopic",
                     int(sys.argv[3]) if len(sys.argv) > 3 else 1,
                     float(sys.argv[4]) if len(sys.argv) > 4 else 60))
