"""Request-reply: a responder (push consumer + ``Producer.reply``) and a requester (``Producer.request``).
Run both roles here, or each in its own process:

    python examples/request_reply.py [NAMESRV] [TOPIC]              # both, in this process
    python examples/request_reply.py NAMESRV TOPIC responder        # answers until Ctrl-C
    python examples/request_reply.py NAMESRV TOPIC requester [N]    # sends N requests, prints the replies
"""

import asyncio
import os
import sys

from ferrymq.client import ConsumeStatus, MessageExt, Producer, PushConsumer, new_message
from ferrymq.errors import RequestTimeoutError

REQUEST_TIMEOUT_MS = 10_000


async def responder(namesrv: str, topic: str, stop: asyncio.Event) -> None:
    async with Producer(namesrv, "example-responder") as producer:
        async def on_requests(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                await producer.reply(m, m.body.upper())  # the answer travels back to the requester
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(namesrv, "example-responder-group", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
        consumer.subscribe(topic, "*")
        consumer.register_message_listener(on_requests)
        async with consumer:
            print("responder ready", flush=True)
            await stop.wait()


async def requester(namesrv: str, topic: str, count: int) -> None:
    async with Producer(namesrv, "example-requester") as producer:
        for i in range(count):
            try:
                reply = await producer.request(new_message(topic, f"hello {i}"), REQUEST_TIMEOUT_MS)
            except RequestTimeoutError as exc:
                sys.exit(f"no answer: {exc}")
            print(f"reply {reply.body.decode()!r} (CORRELATION_ID {reply.properties['CORRELATION_ID']})")


async def main(namesrv: str, topic: str, role: str, count: int) -> None:
    stop = asyncio.Event()
    if role == "responder":
        await responder(namesrv, topic, stop)
    elif role == "requester":
        await requester(namesrv, topic, count)
    else:
        task = asyncio.create_task(responder(namesrv, topic, stop))
        try:
            await requester(namesrv, topic, count)
        finally:
            stop.set()
            await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"),
                     sys.argv[2] if len(sys.argv) > 2 else "ExampleRequestTopic",
                     sys.argv[3] if len(sys.argv) > 3 else "both",
                     int(sys.argv[4]) if len(sys.argv) > 4 else 3))
