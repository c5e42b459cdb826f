"""SQL92 property filter: send 10 orders with a ``price`` and a ``region`` property, then consume only
``price >= 5 AND region = 'eu'`` (the broker filters; it needs ``enablePropertyFilter=true``).

    python examples/sql_filter.py [NAMESRV] [TOPIC] [TIMEOUT]
"""

import asyncio
import os
import sys

from ferrymq.client import ConsumeStatus, MessageExt, MessageSelector, Producer, PushConsumer, new_message

SELECTOR = MessageSelector.by_sql("price >= 5 AND region = 'eu'")


async def main(namesrv: str, topic: str, timeout_s: float) -> None:
    async with Producer(namesrv, "example-sql-producer") as producer:
        for i in range(10):
            region = "eu" if i % 2 else "us"
            await producer.send(new_message(topic, f"order {i}", tags="order",
                                            properties={"price": str(i), "region": region}))
    expected = 3  # orders 5, 7 and 9
    received: list[str] = []
    done = asyncio.Event()

    async def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:
            print(f"got {m.body.decode()!r} price={m.properties['price']} region={m.properties['region']}")
            received.append(m.body.decode())
        if len(received) >= expected:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(namesrv, "example-sql-group", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(topic, SELECTOR)
    consumer.register_message_listener(on_messages)
    async with consumer:
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            sys.exit(f"only {len(received)} of {expected} matching messages within {timeout_s} s")
    print("matched", len(received))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
                     sys.argv[2] if len(sys.argv) > 2 else "ExampleSqlTopic",
                     float(sys.argv[3]) if len(sys.argv) > 3 else 60))
