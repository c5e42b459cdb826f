"""Blocking facades: each object runs its async twin on a private event loop in a background thread.

    with SyncProducer("127.0.0.1:9876", "pg") as p:
        p.send(new_message("T", b"hi"))

The private loop is uvloop's when it is installed (as in the servers), else asyncio's own. A blocking call
hands its coroutine to the loop thread with one ``call_soon_threadsafe`` and waits on a plain lock that the
task's completion releases: no ``concurrent.futures.Future`` and no chained callbacks in between. A
uvloop loop and the lock together cost about half the CPU per send of asyncio's loop with
``run_coroutine_threadsafe`` (benchmarks/RESULTS.md, issue 29, stop 34).
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from ferrymq.client.admin import Admin
from ferrymq.client.consumer.pull import PullConsumer
from ferrymq.client.consumer.push import PushConsumer
from ferrymq.client.producer import Producer
from ferrymq.client.selectors import MessageSelector

T = TypeVar("T")
#: How long close() waits for the background loop to finish.
LOOP_STOP_TIMEOUT_S = 30


def new_private_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed, else asyncio's default one."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = new_private_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop thread and return its result, or raise its exception here. As
        ``run_coroutine_threadsafe(coro, loop).result(timeout_s)`` did: TimeoutError after ``timeout_s``
        (the coroutine goes on), ``concurrent.futures.CancelledError`` when its task was cancelled."""
        if not asyncio.iscoroutine(coro):
            raise TypeError("a coroutine object is required")
        done = _thread.allocate_lock()
        done.acquire()
        #: the finished task, or the exception that kept it from starting
        finished: list[asyncio.Task[T] | BaseException] = []
        loop = self.loop

        def on_done(task: asyncio.Task[T]) -> None:
            finished.append(task)
            done.release()

        def begin() -> None:
            try:
                loop.create_task(coro).add_done_callback(on_done)
            except BaseException as exc:  # the waiting caller gets it, as run_coroutine_threadsafe's future did
                finished.append(exc)
                done.release()
                raise

        loop.call_soon_threadsafe(begin)
        if not done.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise TimeoutError
        outcome = finished[0]
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome.cancelled():
            raise concurrent.futures.CancelledError()
        return outcome.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(LOOP_STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


A = TypeVar("A")


class _SyncFacade(Generic[A]):
    """Coroutine methods of the wrapped object become blocking calls; other attributes pass through."""

    def __init__(self, factory: Callable[[], A], *, autostart: bool = True) -> None:
        self._loop_thread = _LoopThread(f"ferrymq-{type(self).__name__}")

        async def build() -> A:
            return factory()
        self._obj: A = self._loop_thread.run(build())
        self._started = False
        if autostart:
            self.start()

    def start(self) -> None:
        if not self._started:
            self._loop_thread.run(self._obj.start())  # type: ignore[attr-defined]
            self._started = True

    def close(self) -> None:
        if self._started:
            try:
                self._loop_thread.run(self._obj.close(), LOOP_STOP_TIMEOUT_S)  # type: ignore[attr-defined]
            finally:
                self._started = False
        self._loop_thread.stop()

    @property
    def wrapped(self) -> A:
        return self._obj

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if asyncio.iscoroutinefunction(attr):
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop_thread.run(attr(*args, **kwargs))
            call.__name__ = name
            return call
        return attr

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncProducer(_SyncFacade[Producer]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(lambda: Producer(*args, **kwargs))


class SyncPullConsumer(_SyncFacade[PullConsumer]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(lambda: PullConsumer(*args, **kwargs))


class SyncAdmin(_SyncFacade[Admin]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(lambda: Admin(*args, **kwargs))


class SyncPushConsumer(_SyncFacade[PushConsumer]):
    """Call ``subscribe``/``register_message_listener`` before ``start()`` (not started automatically)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(lambda: PushConsumer(*args, **kwargs), autostart=False)

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        self._obj.subscribe(topic, expression)

    def register_message_listener(self, listener: Any) -> Any:
        return self._obj.register_message_listener(listener)


__all__ = ["SyncAdmin", "SyncProducer", "SyncPullConsumer", "SyncPushConsumer"]
