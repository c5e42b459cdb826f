"""The responder process of test_request_reply.py: a push consumer (SQL92 selector ``kind = 'ping'``) that
answers each request with ``pong:<body>:<pid>`` through ``Producer.reply``; prints ``responder ready`` once
started and runs until SIGTERM.

    python request_reply_responder.py <namesrv> <topic>
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from ferrymq.client import ConsumeStatus, MessageExt, MessageSelector, Producer, PushConsumer


async def main(ns: str, topic: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with Producer(ns, "rr-responder-pg") as producer:
        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                await producer.reply(m, b"pong:" + m.body + f":{os.getpid()}".encode())
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(ns, "rr-responder-cg", consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                rebalance_interval_ms=500, heartbeat_broker_interval_ms=1000)
        consumer.subscribe(topic, MessageSelector.by_sql("kind = 'ping'"))
        consumer.register_message_listener(listener)
        await consumer.start()
        print("responder ready", flush=True)
        try:
            await stop.wait()
        finally:
            await consumer.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
