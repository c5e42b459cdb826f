"""The read-only web console: server-rendered pages (Jinja2, autoescaped) served by aiohttp, with uPlot
(vendored from the npm package ``uplot``, MIT, in ``static/``) drawing the sampled series.

| path                      | shows                                                                 |
|---------------------------|-----------------------------------------------------------------------|
| ``/``                     | brokers by group: role, put/get TPS, replication lag; TPS chart       |
| ``/topics``               | every topic                                                           |
| ``/topics/{topic}``       | per-queue min/max offsets and last store time                         |
| ``/groups``               | consumer groups with total lag                                        |
| ``/groups/{group}``       | lag per queue; lag chart                                              |
| ``/messages?id=&topic=&key=`` | a message by id (offset msgId or client msgId), or by topic + key |
| ``/api/samples.json?prefix=`` | the sampled series ({"t": [...], "series": {...}})                |
| ``/healthz``              | ``ok``                                                                 |

Errors are pages, never tracebacks: an unknown topic or group is 404, a malformed message id or a missing
parameter is 400, a cluster that cannot be reached is 502.

Access: with credentials (``common.http_auth.HttpAuth``: ``ferry console --auth-token`` / ``--basic-auth``)
every path but ``/healthz`` answers 401 with ``WWW-Authenticate`` unless the request carries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import jinja2
from aiohttp import web
from aiohttp.typedefs import Middleware

from ferrymq.client import Admin
from ferrymq.client.admin import check_message_id
from ferrymq.common.http_auth import HttpAuth
from ferrymq.console.data import SAMPLE_INTERVAL_S, ConsoleData
from ferrymq.errors import ClientError, FerryError, TopicNotExistError
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

_DATA: web.AppKey[ConsoleData] = web.AppKey("data", ConsoleData)
_ENV: web.AppKey[jinja2.Environment] = web.AppKey("env", jinja2.Environment)
#: answered without credentials (a liveness probe learns nothing from it)
OPEN_PATHS = frozenset({"/healthz"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class PageError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _render(request: web.Request, template: str, http_status: int = 200, **values: Any) -> web.Response:
    env = request.app[_ENV]
    values.setdefault("title", f"Error {http_status}" if http_status >= 400 else "ferrymq")
    values.setdefault("nav", "")
    body = env.get_template(template).render(**values)
    return web.Response(text=body, status=http_status, content_type="text/html")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _render(request, "error.html", exc.status, status=exc.status, message=exc.reason)
    except PageError as exc:
        return _render(request, "error.html", exc.status, status=exc.status, message=exc.message)
    except TopicNotExistError as exc:
        return _render(request, "error.html", 404, status=404, message=str(exc))
    except (FerryError, OSError) as exc:
        return _render(request, "error.html", 502, status=502,
                       message=f"the cluster did not answer: {type(exc).__name__}: {exc}")
    except Exception:
        log.exception("console page %s failed", request.path)
        return _render(request, "error.html", 500, status=500, message="internal error (logged by the console)")


def _auth_middleware(auth: HttpAuth) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or auth.allows(request.headers.get("Authorization")):
            return await handler(request)
        return web.Response(status=401, text="credentials required\n",
                            headers={"WWW-Authenticate": auth.challenge()})

    return check


async def cluster_page(request: web.Request) -> web.Response:
    data = request.app[_DATA]
    brokers = await data.brokers()
    groups: dict[str, list[Any]] = {}
    for b in brokers:
        groups.setdefault(f"{b.cluster} / {b.broker_name}", []).append(b)
    return _render(request, "cluster.html", title="Cluster", groups=groups, nav="cluster")


async def topics_page(request: web.Request) -> web.Response:
    data = request.app[_DATA]
    return _render(request, "topics.html", title="Topics", topics=await data.topics(), nav="topics")


async def topic_page(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    queues = await request.app[_DATA].topic_queues(topic)
    return _render(request, "topic.html", title=f"Topic {topic}", topic=topic, queues=queues,
                   total=sum(q["messages"] for q in queues), nav="topics")


async def groups_page(request: web.Request) -> web.Response:
    data = request.app[_DATA]
    names = await data.groups()
    lags = await asyncio.gather(*(data.group_lag(g) for g in names))
    rows = [{"group": g, "queues": len(q), "lag": sum(x.lag for x in q)} for g, q in zip(names, lags, strict=True)]
    return _render(request, "groups.html", title="Consumer groups", groups=rows, nav="groups")


async def group_page(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    data = request.app[_DATA]
    if group not in await data.groups():
        raise PageError(404, f"consumer group {group} is not known to any master")
    queues = await data.group_lag(group)
    return _render(request, "group.html", title=f"Group {group}", group=group, queues=queues,
                   total=sum(q.lag for q in queues), nav="groups")


async def messages_page(request: web.Request) -> web.Response:
    q = request.query
    msg_id, topic, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "").strip()
    messages: list[Any] = []
    searched = bool(msg_id or key)
    if msg_id:
        try:
            msg_id = check_message_id(msg_id)
        except ClientError as exc:
            raise PageError(400, f"bad message id: {exc}") from None
    elif key and not topic:
        raise PageError(400, "a key look-up needs the topic")
    if searched:
        try:
            messages = await request.app[_DATA].find_messages(msg_id or None, topic or None, key or None)
        except ClientError as exc:
            raise PageError(404, str(exc)) from None
    return _render(request, "messages.html", title="Messages", messages=messages, searched=searched, msg_id=msg_id,
                   topic=topic, key=key, nav="messages")


async def samples_json(request: web.Request) -> web.Response:
    columns = request.app[_DATA].samples.as_columns(request.query.get("prefix", ""))
    return web.Response(body=jsonx.dumps(columns), content_type="application/json")


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(admin: Admin, *, sample_interval_s: float = SAMPLE_INTERVAL_S,
             auth: HttpAuth | None = None) -> web.Application:
    """The console application over a started ``Admin`` (the caller closes it); ``auth``: who may read it."""
    middlewares: list[Middleware] = [_errors]
    if auth is not None and auth.required:
        middlewares.insert(0, _auth_middleware(auth))
    app = web.Application(middlewares=middlewares)
    data = ConsoleData(admin)
    app[_DATA] = data
    app[_ENV] = jinja2.Environment(loader=jinja2.PackageLoader("ferrymq.console", "templates"),
                                   autoescape=True, undefined=jinja2.StrictUndefined)
    app.router.add_get("/", cluster_page)
    app.router.add_get("/topics", topics_page)
    app.router.add_get("/topics/{topic}", topic_page)
    app.router.add_get("/groups", groups_page)
    app.router.add_get("/groups/{group}", group_page)
    app.router.add_get("/messages", messages_page)
    app.router.add_get("/api/samples.json", samples_json)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static", str(resources.files("ferrymq.console") / "static"))

    async def sampler(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(data.sample_forever(sample_interval_s), name="console-sampler")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(sampler)
    return app


async def serve(admin: Admin, host: str, port: int, *, sample_interval_s: float = SAMPLE_INTERVAL_S,
                auth: HttpAuth | None = None) -> tuple[web.AppRunner, int]:
    """Start the console on host:port (0 = any free port); the runner (``await runner.cleanup()`` stops it)
    and the bound port."""
    runner = web.AppRunner(make_app(admin, sample_interval_s=sample_interval_s, auth=auth), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound
