"""Read every queue of a topic from the start with the (blocking) pull consumer, then commit.

    python examples/pull_consumer.py [NAMESRV] [TOPIC]
"""

import os
import sys

from ferrymq.client import PullStatus
from ferrymq.client.sync import SyncPullConsumer


def main(namesrv: str, topic: str) -> None:
    total = 0
    with SyncPullConsumer(namesrv, "example-pull-group") as consumer:
        for mq in consumer.fetch_subscribe_message_queues(topic):
            offset = max(consumer.fetch_committed_offset(mq), consumer.min_offset(mq), 0)
            while True:
                result = consumer.pull(mq, offset, 32)
                for m in result.messages:
                    print(f"{mq.broker_name}/{mq.queue_id}@{m.queue_offset}: {m.body.decode()!r}")
                total += len(result.messages)
                if result.status is not PullStatus.FOUND:
                    break
                offset = result.next_begin_offset
            consumer.commit_offset(mq, offset)
    print("pulled", total)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
         sys.argv[2] if len(sys.argv) > 2 else "ExampleTopic")
