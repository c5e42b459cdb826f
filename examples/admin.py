"""Create a topic and print the cluster, the topic's route and status.

    python examples/admin.py [NAMESRV] [TOPIC]
"""

import asyncio
import os
import sys

from ferrymq.client import Admin


async def main(namesrv: str, topic: str) -> None:
    async with Admin(namesrv) as admin:
        info = await admin.cluster_info()
        for name, broker in info["brokerAddrTable"].items():
            print("broker", name, broker["cluster"], broker["brokerAddrs"])
        print("created on", await admin.create_topic(topic, read_queue_nums=4, write_queue_nums=4))
        route = await admin.wait_for_route(topic)  # the broker registers it asynchronously
        print("route", [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas])
        for mq, min_offset, max_offset, _ in await admin.topic_status(topic):
            print(f"queue {mq.broker_name}/{mq.queue_id}: offsets {min_offset}..{max_offset}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
                     sys.argv[2] if len(sys.argv) > 2 else "ExampleTopic"))
