"""Client-side load, run inside worker processes (see ``mpwork``). Every function here is
``async def fn(spec, ctl) -> dict`` and imports the client lazily.

Counting: after the common start signal, ``warmup_s`` of load is not counted; the next ``duration_s``
is. Latencies (perf_counter_ns) are taken only for requests started inside the counted window and
shipped back sorted and thinned to ``LATENCY_SAMPLE_CAP`` samples per worker.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

from ferrymq.cli.bench_impl.stats import thin

LATENCY_SAMPLE_CAP = 50_000
#: pause after a failed send, so a broken broker does not turn into a busy loop
ERROR_BACKOFF_S = 0.01
_TS = struct.Struct(">q")


def _body(size: int) -> bytes:
    return (b"ferrybench-" * (size // 11 + 1))[:size]


class Window:
    """The counted window shared by the coroutines of one worker."""

    def __init__(self, warmup_s: float, duration_s: float) -> None:
        now = time.monotonic()
        self.t_measure = now + warmup_s
        self.t_end = self.t_measure + duration_s
        self.count = 0
        self.bytes = 0
        self.errors = 0
        self.not_ok = 0
        self.lat_ns: list[int] = []
        self.first_error: str | None = None

    def done(self) -> bool:
        return time.monotonic() >= self.t_end

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"

    def result(self) -> dict[str, Any]:
        return {"count": self.count, "bytes": self.bytes, "elapsed_s": self.t_end - self.t_measure,
                "errors": self.errors, "not_ok": self.not_ok, "first_error": self.first_error,
                "lat_ns": thin(sorted(self.lat_ns), LATENCY_SAMPLE_CAP)}


async def _start_producers(spec: dict[str, Any], n: int, tag: str) -> list[Any]:
    from ferrymq.client.producer import Producer

    producers = []
    for i in range(n):
        p = Producer(spec["name_server"], f"bench_{tag}_{spec['worker']}_{i}",
                     send_timeout_ms=spec.get("send_timeout_ms", 10_000), send_latency_fault_enable=False)
        await p.start()
        producers.append(p)
    return producers


async def _warm(producers: list[Any], msg_factory: Any, batch: int) -> None:
    for p in producers:
        for _ in range(3):
            if batch:
                await p.send_batch([msg_factory() for _ in range(batch)])
            else:
                await p.send(msg_factory())


async def produce(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """``spec``: name_server, topic, worker, producers, body_bytes, batch (0 = single sends),
    warmup_s, duration_s, optional total_bytes (fill mode: stop once this many body bytes are stored)."""
    from ferrymq.client.values import SendStatus, new_message

    topic, body, batch = spec["topic"], _body(spec["body_bytes"]), spec.get("batch", 0)
    producers = await _start_producers(spec, spec["producers"], "p")
    total_bytes = spec.get("total_bytes")

    def msg() -> Any:
        return new_message(topic, body, tags="bench")

    try:
        if not total_bytes:  # fill runs are not measured: no warm-up (it would overshoot the fill size)
            await _warm(producers, msg, batch)
        await ctl.ready()
        if total_bytes:
            win = Window(0.0, 1e9)
        else:
            win = Window(spec["warmup_s"], spec["duration_s"])
        per_send = batch or 1
        send_bytes = per_send * len(body)

        async def one(p: Any) -> None:
            while True:
                now = time.monotonic()
                if now >= win.t_end or (total_bytes and win.bytes >= total_bytes):
                    return
                counted = now >= win.t_measure
                t0 = time.perf_counter_ns()
                try:
                    if batch:
                        res = await p.send_batch([msg() for _ in range(batch)])
                    else:
                        res = await p.send(msg())
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    if counted:
                        win.error(exc)
                    await asyncio.sleep(ERROR_BACKOFF_S)
                    continue
                t1 = time.perf_counter_ns()
                if counted and time.monotonic() <= win.t_end:
                    win.count += per_send
                    win.bytes += send_bytes
                    win.lat_ns.append(t1 - t0)
                    if res.status is not SendStatus.SEND_OK:
                        win.not_ok += 1

        t_start = time.monotonic()
        await asyncio.gather(*(one(p) for p in producers))
        out = win.result()
        if total_bytes:
            out["elapsed_s"] = time.monotonic() - t_start
        return out
    finally:
        for p in producers:
            await p.close()


async def consume(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """Drain assigned queues from ``start_offsets`` to ``end_offsets`` with PullConsumer (``max_nums``
    per pull, messages decoded), one coroutine per queue; bounded by ``max_s``."""
    from ferrymq.client.consumer.pull import PullConsumer
    from ferrymq.client.values import PullStatus
    from ferrymq.common.route import MessageQueue

    c = PullConsumer(spec["name_server"], spec["group"])
    await c.start()
    try:
        queues = [(MessageQueue(spec["topic"], b, q), s, e) for b, q, s, e in spec["queues"]]
        if queues:  # warm the connection and the route
            await c.pull(queues[0][0], queues[0][1], 1)
        await ctl.ready()
        counts = [0]
        nbytes = [0]
        errors: list[str] = []
        deadline = time.monotonic() + spec["max_s"]
        max_nums = spec.get("max_nums", 32)

        async def drain(mq: Any, offset: int, end: int) -> None:
            while offset < end and time.monotonic() < deadline:
                try:
                    r = await c.pull(mq, offset, max_nums)
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(ERROR_BACKOFF_S)
                    continue
                if r.status is PullStatus.FOUND:
                    counts[0] += len(r.messages)
                    nbytes[0] += sum(len(m.body) for m in r.messages)
                offset = r.next_begin_offset

        t0 = time.monotonic()
        await asyncio.gather(*(drain(mq, s, e) for mq, s, e in queues))
        return {"count": counts[0], "bytes": nbytes[0], "elapsed_s": time.monotonic() - t0,
                "errors": len(errors), "first_error": errors[0] if errors else None}
    finally:
        await c.close()


async def e2e(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """role=producer: send at ``rate`` msg/s (open loop, body starts with time.time_ns()).
    role=consumer: long-poll every queue from its current max offset, latency = now - embedded time."""
    if spec["role"] == "producer":
        return await _e2e_producer(spec, ctl)
    return await _e2e_consumer(spec, ctl)


async def _e2e_producer(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    from ferrymq.client.values import new_message

    topic, pad = spec["topic"], _body(max(0, spec["body_bytes"] - 8))
    (p,) = await _start_producers(spec, 1, "e2e")
    try:
        await p.send(new_message(topic, _TS.pack(0) + pad))
        await asyncio.sleep(spec.get("consumer_settle_s", 1.0))  # consumers are parked on long polls
        await ctl.ready()
        rate = spec["rate"]
        total = int(rate * (spec["warmup_s"] + spec["duration_s"]))
        sem = asyncio.Semaphore(spec.get("max_in_flight", 256))
        errors = [0]
        sent = [0]

        async def one() -> None:
            try:
                await p.send(new_message(topic, _TS.pack(time.time_ns()) + pad))
                sent[0] += 1
            except Exception:  # noqa: BLE001
                errors[0] += 1
            finally:
                sem.release()

        t0 = time.monotonic()
        tasks = set()
        for i in range(total):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            t = asyncio.ensure_future(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return {"sent": sent[0], "errors": errors[0], "elapsed_s": time.monotonic() - t0,
                "wall_measure_from_ns": 0}
    finally:
        await p.close()


async def _e2e_consumer(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    from ferrymq.client.consumer.pull import PullConsumer
    from ferrymq.client.values import PullStatus

    c = PullConsumer(spec["name_server"], spec["group"])
    await c.start()
    try:
        mqs = await c.fetch_subscribe_message_queues(spec["topic"])
        offsets = {mq: await c.max_offset(mq) for mq in mqs}
        lat: list[int] = []
        received = [0]
        stop = asyncio.Event()
        measure_from_ns = [0]

        async def poll(mq: Any) -> None:
            offset = offsets[mq]
            while not stop.is_set():
                try:
                    r = await c.pull(mq, offset, 32, block=True)
                except Exception:  # noqa: BLE001
                    await asyncio.sleep(ERROR_BACKOFF_S)
                    continue
                now = time.time_ns()
                if r.status is PullStatus.FOUND:
                    for m in r.messages:
                        (ts,) = _TS.unpack_from(m.body, 0)
                        if ts >= measure_from_ns[0] and ts:
                            lat.append(now - ts)
                        received[0] += 1
                offset = r.next_begin_offset

        tasks = [asyncio.ensure_future(poll(mq)) for mq in mqs]
        await ctl.ready()
        measure_from_ns[0] = time.time_ns() + int(spec["warmup_s"] * 1e9)
        await asyncio.sleep(spec["warmup_s"] + spec["duration_s"] + spec.get("drain_s", 2.0))
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"received": received[0], "lat_ns": thin(sorted(lat), LATENCY_SAMPLE_CAP),
                "samples_total": len(lat)}
    finally:
        await c.close()


async def cpp_sync(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """The C++ client (PyPI rocketmq==0.4.4, ctypes over librocketmq) doing sync sends from one producer."""
    from rocketmq.client import Message, Producer  # type: ignore[import-not-found]

    p = Producer(f"bench_cpp_{spec['worker']}")
    p.set_namesrv_addr(spec["name_server"])
    p.start()
    body = _body(spec["body_bytes"])

    def make() -> Any:
        m = Message(spec["topic"])
        m.set_tags("bench")
        m.set_body(body)
        return m

    try:
        for _ in range(5):
            p.send_sync(make())
        await ctl.ready()
        win = Window(spec["warmup_s"], spec["duration_s"])
        while not win.done():
            counted = time.monotonic() >= win.t_measure
            t0 = time.perf_counter_ns()
            try:
                res = p.send_sync(make())
            except Exception as exc:  # noqa: BLE001
                if counted:
                    win.error(exc)
                time.sleep(ERROR_BACKOFF_S)
                continue
            t1 = time.perf_counter_ns()
            if counted:
                win.count += 1
                win.bytes += len(body)
                win.lat_ns.append(t1 - t0)
                if int(getattr(res.status, "value", res.status)) != 0:
                    win.not_ok += 1
        return win.result()
    finally:
        p.shutdown()


async def redis_wait(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """One redis-py client: XADD then ``WAIT 1 0`` (pipelined in one round trip), sequentially."""
    import redis  # type: ignore[import-not-found]

    r = redis.Redis(host="127.0.0.1", port=spec["port"])
    value = _body(spec["body_bytes"])
    stream = spec.get("stream", "benchwait")

    def one() -> int:
        pipe = r.pipeline(transaction=False)
        pipe.xadd(stream, {"f": value})
        pipe.execute_command("WAIT", 1, 0)
        _, acked = pipe.execute()
        return int(acked)

    for _ in range(10):
        one()
    await ctl.ready()
    win = Window(spec["warmup_s"], spec["duration_s"])
    while not win.done():
        counted = time.monotonic() >= win.t_measure
        t0 = time.perf_counter_ns()
        acked = one()
        t1 = time.perf_counter_ns()
        if counted:
            win.count += 1
            win.bytes += len(value)
            win.lat_ns.append(t1 - t0)
            if acked < 1:
                win.not_ok += 1
    r.close()
    return win.result()


async def _timed_loop(spec: dict[str, Any], ctl: Any, one: Any, size: int) -> dict[str, Any]:
    """Run ``await one()`` back to back (one in flight) over the counted window; ``one`` returns False for an
    answer that is not the success (counted in not_ok)."""
    await ctl.ready()
    win = Window(spec["warmup_s"], spec["duration_s"])
    while not win.done():
        counted = time.monotonic() >= win.t_measure
        t0 = time.perf_counter_ns()
        try:
            ok = await one()
        except Exception as exc:  # noqa: BLE001 - counted and reported
            if counted:
                win.error(exc)
            await asyncio.sleep(ERROR_BACKOFF_S)
            continue
        t1 = time.perf_counter_ns()
        if counted and time.monotonic() <= win.t_end:
            win.count += 1
            win.bytes += size
            win.lat_ns.append(t1 - t0)
            if ok is False:
                win.not_ok += 1
    return win.result()


async def redis_xadd(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """One redis-py client (asyncio): XADD after XADD, each awaited (the server's appendfsync decides when
    the answer comes: ``always`` after the fsync)."""
    import redis.asyncio as aredis  # type: ignore[import-not-found]

    r = aredis.Redis(host="127.0.0.1", port=spec["port"])
    value = _body(spec["body_bytes"])
    stream = spec.get("stream", "benchdurable")

    async def one() -> bool:
        await r.xadd(stream, {"f": value})
        return True

    try:
        for _ in range(10):
            await one()
        return await _timed_loop(spec, ctl, one, len(value))
    finally:
        await r.aclose()


async def nats_publish(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """One nats-py client publishing to a JetStream stream (file storage), awaiting each publish ack."""
    import nats  # type: ignore[import-not-found]
    from nats.js.api import StorageType, StreamConfig  # type: ignore[import-not-found]

    nc = await nats.connect(spec["url"])
    try:
        js = nc.jetstream()
        stream, subject = spec["stream"], spec["subject"]
        try:
            await js.add_stream(StreamConfig(name=stream, subjects=[subject], storage=StorageType.FILE))
        except Exception:  # noqa: BLE001 - already there (an earlier repeat)
            pass
        body = _body(spec["body_bytes"])

        async def one() -> bool:
            ack = await js.publish(subject, body)
            return bool(ack.seq)

        for _ in range(10):
            await one()
        return await _timed_loop(spec, ctl, one, len(body))
    finally:
        await nc.close()


async def rabbit_publish(spec: dict[str, Any], ctl: Any) -> dict[str, Any]:
    """One aio-pika client publishing persistent messages to a durable queue with publisher confirms,
    awaiting each confirm."""
    import aio_pika  # type: ignore[import-not-found]

    conn = await aio_pika.connect(spec["url"])
    try:
        channel = await conn.channel(publisher_confirms=True)
        queue = await channel.declare_queue(spec["queue"], durable=True)
        body = _body(spec["body_bytes"])
        exchange = channel.default_exchange

        async def one() -> bool:
            await exchange.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                                   routing_key=queue.name)
            return True

        for _ in range(10):
            await one()
        out = await _timed_loop(spec, ctl, one, len(body))
        if spec.get("purge", True):  # workload 13 counts the queue and purges it after its CPU sample
            await queue.purge()
        return out
    finally:
        await conn.close()
