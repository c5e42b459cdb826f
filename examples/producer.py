"""Send a few messages (plain, keyed+tagged, ordered by key, batch).

    python examples/producer.py [NAMESRV] [TOPIC]      (defaults: $NAMESRV_ADDR or 127.0.0.1:9876, ExampleTopic)
"""

import asyncio
import os
import sys

from ferrymq.client import Producer, new_message, select_by_hash


async def main(namesrv: str, topic: str) -> None:
    async with Producer(namesrv, "example-producer") as producer:
        result = await producer.send(new_message(topic, "hello ferrymq", tags="TagA", keys=["order-1"],
                                                 properties={"source": "example"}))
        print("sent", result.status.name, result.msg_id, result.message_queue.queue_id, result.queue_offset)
        # messages with the same key go to the same queue, so they are consumed in order
        for step in ("created", "paid", "shipped"):
            r = await producer.send(new_message(topic, f"order-7 {step}", tags="TagB", keys="order-7"),
                                    selector=select_by_hash, arg="order-7")
            print("ordered", step, "-> queue", r.message_queue.queue_id)
        batch = await producer.send_batch([new_message(topic, f"batch {i}", tags="TagA") for i in range(3)])
        print("batch", batch.status.name, batch.queue_offset)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
                     sys.argv[2] if len(sys.argv) > 2 else "ExampleTopic"))
