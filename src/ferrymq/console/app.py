"""The web console: server-rendered pages (Jinja2, autoescaped) served by aiohttp, with uPlot (vendored from
the npm package ``uplot``, MIT, in ``static/``) drawing the sampled series; with a users file, logged-in admins
act on the cluster through forms (``console.actions``).

| path (GET)                        | shows                                                          |
|-----------------------------------|----------------------------------------------------------------|
| ``/overview``                     | brokers alive and dead, TPS, topics, groups, the most lagging groups, DLQs |
| ``/``                             | brokers by group: role, put/get TPS, replication lag; dead brokers in red; charts |
| ``/topics``, ``/topics/{topic}``  | topics; per-queue offsets, consuming groups (forms: create, update, delete, send) |
| ``/groups``, ``/groups/{group}``  | groups with lag; lag per queue, clients with TPS and lag (forms: create, delete, reset, skip) |
| ``/groups/{group}/dlq``           | the group's dead-lettered messages (form: resend)              |
| ``/messages``                     | by id, by topic + key, by topic + time range; consumption state per group |
| ``/producers``                    | every producer connection of every broker                      |
| ``/brokers/{addr}/config``        | a broker's configuration (form: set a runtime-safe key)        |
| ``/ha``                           | replication links, controller state: SyncStateSet, epochs (form: elect) |
| ``/login``                        | the log-in form (with ``--users-file``)                        |
| ``/api/samples.json?prefix=``     | the sampled series ({"t": [...], "series": {...}, "unknown": {...}}) |
| ``/healthz``                      | ``ok``                                                         |

Every action is a POST carrying the session's CSRF token, answered with a redirect (303) to the page it came
from, which shows the outcome once.

Access (docs/console.md "Who can read it, who can act"):

* no ``--users-file``: read-only for whoever passes the header credentials (``common.http_auth.HttpAuth``:
  ``--auth-token`` / ``--basic-auth``; none configured: everyone reaching the loopback address). No action is
  offered and every POST is 403.
* ``--users-file``: every page but ``/login``, ``/healthz`` and ``/static`` needs a session (a GET without
  one is redirected to ``/login``, anything else is 403) or the header credentials when configured (then
  read-only). A POST needs a session, its CSRF token, and for actions the admin role (else 403); a POST
  whose ``Origin`` header names another host is 403.

Errors are pages, never tracebacks: an unknown topic or group is 404, a malformed message id or a missing
parameter is 400, a cluster that cannot be reached is 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hmac
import logging
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
from aiohttp import web

from ferrymq.client import Admin
from ferrymq.client.admin import check_message_id
from ferrymq.common.http_auth import HttpAuth
from ferrymq.common.topic import DLQ_GROUP_TOPIC_PREFIX
from ferrymq.console import auth as console_auth
from ferrymq.console.actions import ConsoleActions
from ferrymq.console.auth import LoginThrottle, Role, Session, SessionStore, User
from ferrymq.console.data import (
    SAMPLE_INTERVAL_S,
    ConsoleData,
    fmt_ms,
    lag_severity,
    replica_lag_severity,
)
from ferrymq.errors import ClientError, FerryError, TopicNotExistError
from ferrymq.remoting import jsonx

log = logging.getLogger(__name__)

_DATA: web.AppKey[ConsoleData] = web.AppKey("data", ConsoleData)
_ACTIONS: web.AppKey[ConsoleActions] = web.AppKey("actions", ConsoleActions)
_ENV: web.AppKey[jinja2.Environment] = web.AppKey("env", jinja2.Environment)
#: answered without credentials (a liveness probe learns nothing from it)
OPEN_PATHS = frozenset({"/healthz", "/favicon.ico"})
#: answered without a session when a users file is configured
LOGIN_PATH = "/login"
SESSION_COOKIE = "ferrymq_session"
#: the double-submit cookie of the log-in form (it has no session yet to hold a CSRF token)
LOGIN_COOKIE = "ferrymq_login"
CSRF_FIELD = "csrf_token"
#: password checks (scrypt, in worker threads) running at once; further log-ins wait their turn
PASSWORD_CHECKS_AT_ONCE = 2
#: where a log-in lands without a (safe) next page
DEFAULT_LANDING = "/overview"
#: bytes of a message body shown on a page (the rest is counted, not shown)
BODY_SHOWN_BYTES = 16 * 1024
_LOGIN_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class AccessConfig:
    """Who may read and who may act: header credentials, and the accounts of a users file."""

    header_auth: HttpAuth = field(default_factory=HttpAuth)
    users: dict[str, User] = field(default_factory=dict)
    sessions: SessionStore = field(default_factory=SessionStore)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    #: mark the session cookie Secure (the console is reached through a TLS-terminating proxy)
    secure_cookie: bool = False
    clock: Callable[[], float] = time.monotonic
    kdf_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PASSWORD_CHECKS_AT_ONCE))

    @property
    def logins(self) -> bool:
        return bool(self.users)


_ACCESS: web.AppKey[AccessConfig] = web.AppKey("access", AccessConfig)
_SESSION: web.RequestKey[Session | None] = web.RequestKey("session", Session)


class PageError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _session(request: web.Request) -> Session | None:
    return request.get(_SESSION)


def _render(request: web.Request, template: str, http_status: int = 200, **values: Any) -> web.Response:
    env = request.app[_ENV]
    session = _session(request)
    values.setdefault("title", f"Error {http_status}" if http_status >= 400 else "ferrymq")
    values.setdefault("nav", "")
    values.setdefault("login_page", False)
    values["session"] = session
    values["can_act"] = session is not None and session.role.can_act
    values["csrf"] = session.csrf_token if session is not None else ""
    values["flashes"] = session.take_flashes() if session is not None else []
    values["logins"] = request.app[_ACCESS].logins
    body = env.get_template(template).render(**values)
    return web.Response(text=body, status=http_status, content_type="text/html",
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                                 "X-Content-Type-Options": "nosniff"})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _render(request, "error.html", exc.status, status=exc.status, message=exc.text or exc.reason)
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


def _forbidden(reason: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=reason)


def _same_origin(request: web.Request) -> bool:
    """No ``Origin`` header (not a browser's cross-site form), or one naming this console's host."""
    origin = request.headers.get("Origin")
    return origin is None or urllib.parse.urlsplit(origin).netloc == request.host


@web.middleware
async def _access(request: web.Request, handler: Handler) -> web.StreamResponse:
    cfg = request.app[_ACCESS]
    path = request.path
    session = cfg.sessions.get(request.cookies.get(SESSION_COOKIE), cfg.clock()) if cfg.logins else None
    request[_SESSION] = session
    if path in OPEN_PATHS:
        return await handler(request)
    header_ok = cfg.header_auth.required and cfg.header_auth.allows(request.headers.get("Authorization"))
    if not cfg.logins:
        if cfg.header_auth.required and not header_ok:
            return web.Response(status=401, text="credentials required\n",
                                headers={"WWW-Authenticate": cfg.header_auth.challenge()})
        if request.method not in ("GET", "HEAD"):
            raise _forbidden("this console is read-only: start it with --users-file to log in and act")
        return await handler(request)
    if request.method not in ("GET", "HEAD") and not _same_origin(request):
        raise _forbidden("cross-origin request refused")
    if path == LOGIN_PATH or path.startswith("/static/"):
        return await handler(request)
    if session is None:
        if header_ok and request.method in ("GET", "HEAD"):
            return await handler(request)
        if request.method in ("GET", "HEAD"):
            raise web.HTTPFound(f"{LOGIN_PATH}?next={urllib.parse.quote(request.path_qs, safe='')}")
        raise _forbidden("log in first: no session")
    if request.method not in ("GET", "HEAD"):
        form = await request.post()
        token = form.get(CSRF_FIELD)
        if not isinstance(token, str) or not session.csrf_ok(token):
            raise _forbidden("missing or wrong CSRF token: reload the page and try again")
        if path != "/logout" and not session.role.can_act:
            raise _forbidden(f"user {session.user} is {session.role.value}: no actions")
    return await handler(request)


# ---- log-in ----------------------------------------------------------------------------------------------------
def _safe_next(value: str | None) -> str:
    """A local path to go to after log-in (never another site)."""
    # browsers drop tabs and newlines inside URLs ("/\t/evil.example" becomes "//evil.example") and read "\\"
    # as "/": anything but a plain path is refused
    if (not value or not value.startswith("/") or value.startswith("//") or "\\" in value
            or any(c.isspace() or not c.isprintable() for c in value)):
        return DEFAULT_LANDING
    return value


async def login_page(request: web.Request) -> web.Response:
    cfg = request.app[_ACCESS]
    if not cfg.logins:
        raise PageError(404, "this console has no accounts (start it with --users-file to log in)")
    return _login_form(request, "", 200, request.query.get("next"))


def _login_form(request: web.Request, error: str, status: int, next_path: str | None) -> web.Response:
    # one token per browser until it logs in: a second log-in page (another tab, a redirected favicon
    # request) must not invalidate the form already shown
    token = request.cookies.get(LOGIN_COOKIE, "")
    if not _LOGIN_TOKEN_RE.fullmatch(token):
        token = console_auth.new_token()
    resp = _render(request, "login.html", status, title="Log in", error=error, login_token=token,
                   next=_safe_next(next_path), login_page=True)
    resp.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="Strict", path=LOGIN_PATH,
                    secure=request.app[_ACCESS].secure_cookie)
    return resp


async def login_submit(request: web.Request) -> web.Response:
    cfg = request.app[_ACCESS]
    if not cfg.logins:
        raise PageError(404, "this console has no accounts")
    form = await request.post()
    token = form.get(CSRF_FIELD)
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    if not isinstance(token, str) or not cookie or not hmac.compare_digest(token.encode(), cookie.encode()):
        raise _forbidden("missing or wrong log-in form token: reload the log-in page")
    name = str(form.get("user", ""))[:console_auth.MAX_USER_NAME_CHARS]
    password = str(form.get("password", ""))[:console_auth.MAX_PASSWORD_CHARS]
    next_path = str(form.get("next", ""))
    now = cfg.clock()
    if not cfg.throttle.allowed(name, now):
        return _login_form(request, "too many failed log-ins for this user: wait a minute", 429, next_path)
    user = cfg.users.get(name)
    # the KDF runs in a thread (~0.1 s of one core): the event loop keeps serving; an unknown user costs the same; a few
    # at a time, so a flood of log-ins queues instead of taking every core
    async with cfg.kdf_slots:
        ok = await asyncio.to_thread(_password_ok, user, password)
    if user is None or not ok:
        cfg.throttle.failed(name, now)
        return _login_form(request, "wrong user name or password", 401, next_path)
    cfg.throttle.succeeded(name)
    session = cfg.sessions.create(user, now)
    resp = web.HTTPSeeOther(_safe_next(next_path))
    resp.set_cookie(SESSION_COOKIE, session.session_id, httponly=True, samesite="Strict", path="/",
                    secure=cfg.secure_cookie, max_age=int(cfg.sessions.max_age_s))
    resp.del_cookie(LOGIN_COOKIE, path=LOGIN_PATH)
    raise resp


def _password_ok(user: User | None, password: str) -> bool:
    encoded = user.password_hash if user is not None else console_auth.dummy_hash()
    return console_auth.verify_password(password, encoded) and user is not None


async def logout(request: web.Request) -> web.Response:
    session = _session(request)
    if session is not None:
        request.app[_ACCESS].sessions.end(session.session_id)
    resp = web.HTTPSeeOther(LOGIN_PATH)
    resp.del_cookie(SESSION_COOKIE, path="/")
    raise resp


# ---- pages -----------------------------------------------------------------------------------------------------
async def overview_page(request: web.Request) -> web.Response:
    ov = await request.app[_DATA].overview()
    return _render(request, "overview.html", title="Overview", ov=ov, nav="overview")


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
    data = request.app[_DATA]
    queues = await data.topic_queues(topic)
    config = await data.topic_config(topic)
    groups = await data.topic_groups(topic)
    return _render(request, "topic.html", title=f"Topic {topic}", topic=topic, queues=queues, config=config,
                   groups=groups, total=sum(q["messages"] for q in queues), nav="topics")


async def groups_page(request: web.Request) -> web.Response:
    data = request.app[_DATA]
    names = await data.groups()
    lags = await asyncio.gather(*(data.group_lag(g) for g in names))
    rows = [{"group": g, "queues": len(q), "lag": sum(x.lag for x in q)} for g, q in zip(names, lags, strict=True)]
    return _render(request, "groups.html", title="Consumer groups", groups=rows, nav="groups")


async def group_page(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    data = request.app[_DATA]
    table = await data.group_table()
    if group not in table:
        raise PageError(404, f"consumer group {group} is not known to any master")
    queues = await data.group_lag(group)
    clients = await data.group_clients(group, queues)
    topics = sorted({q.topic for q in queues if not q.topic.startswith("%")})
    has_dlq = await data.has_dlq(group)
    return _render(request, "group.html", title=f"Group {group}", group=group, queues=queues, clients=clients,
                   topics=topics, config=table[group], has_dlq=has_dlq, total=sum(q.lag for q in queues),
                   nav="groups")


async def dlq_page(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    messages = await request.app[_DATA].dlq_messages(group)
    return _render(request, "dlq.html", title=f"Dead letters of {group}", group=group, messages=messages,
                   nav="groups")


def parse_time_ms(value: str, what: str) -> int:
    """A form's time: epoch milliseconds, or a local date-time (``2026-01-31T12:00[:00]``, what a
    ``datetime-local`` input sends, or with a space)."""
    text = value.strip()
    if not text:
        return 0
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise PageError(400, f"bad {what} time {value!r}: a date-time like 2026-01-31T12:00 or epoch ms") from None


async def messages_page(request: web.Request) -> web.Response:
    q = request.query
    msg_id, topic, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "").strip()
    begin, end = q.get("begin", "").strip(), q.get("end", "").strip()
    messages: list[Any] = []
    states: dict[str, dict[str, str]] = {}
    searched = bool(msg_id or key or (topic and (begin or end)) or q.get("search"))
    begin_ms = parse_time_ms(begin, "begin") if begin else 0
    end_ms = parse_time_ms(end, "end") if end else None
    if msg_id:
        try:
            msg_id = check_message_id(msg_id)
        except ClientError as exc:
            raise PageError(400, f"bad message id: {exc}") from None
    elif key and not topic:
        raise PageError(400, "a key look-up needs the topic")
    elif searched and not topic:
        raise PageError(400, "a search by time needs the topic")
    if searched:
        data = request.app[_DATA]
        try:
            messages = await data.find_messages(msg_id or None, topic or None, key or None, begin_ms, end_ms)
        except ClientError as exc:
            raise PageError(404, str(exc)) from None
        states = await data.consumption_states(messages)
    return _render(request, "messages.html", title="Messages", messages=messages, states=states, searched=searched,
                   msg_id=msg_id, topic=topic, key=key, begin=begin, end=end, nav="messages")


async def producers_page(request: web.Request) -> web.Response:
    rows = await request.app[_DATA].producers()
    return _render(request, "producers.html", title="Producers", rows=rows, nav="producers")


async def broker_config_page(request: web.Request) -> web.Response:
    addr = request.match_info["addr"]
    data = request.app[_DATA]
    if addr not in {b.addr for b in await data.admin.brokers()}:
        raise PageError(404, f"no broker {addr} is registered with the name server")
    config = await data.broker_config(addr)
    return _render(request, "broker_config.html", title=f"Broker {addr} config", addr=addr, config=config,
                   nav="cluster")


async def ha_page(request: web.Request) -> web.Response:
    data = request.app[_DATA]
    brokers = await data.brokers()
    rows = []
    for b in brokers:
        links: Any = None
        controller: Any = None
        with contextlib.suppress(ValueError):
            links = jsonx.loads(b.runtime["haSlaves"]) if b.runtime.get("haSlaves") else None
        with contextlib.suppress(ValueError):
            controller = jsonx.loads(b.runtime["controllerRole"]) if b.runtime.get("controllerRole") else None
        rows.append({"b": b, "links": links or [], "controller": controller})
    groups, meta, error = await data.controller_groups()
    replica_rows = []
    for g in groups:
        in_set = set(g.get("syncStateSet", []))
        for rid, r in sorted((g.get("replicas") or {}).items(), key=lambda kv: int(kv[0])):
            role = "master" if int(rid) == g.get("masterId") else ("in sync" if int(rid) in in_set else "out of sync")
            replica_rows.append({"group": g.get("brokerName", ""), "masterEpoch": g.get("masterEpoch", 0),
                                 "syncStateSet": ",".join(str(i) for i in g.get("syncStateSet", [])),
                                 "ssEpoch": g.get("syncStateSetEpoch", 0), "id": int(rid), "role": role,
                                 "addr": r.get("brokerAddr", ""), "alive": bool(r.get("alive")),
                                 "maxPhyOffset": r.get("maxPhyOffset", -1)})
    return _render(request, "ha.html", title="HA and controller", rows=rows, groups=groups, meta=meta,
                   replica_rows=replica_rows, controller_error=error, nav="ha")


async def samples_json(request: web.Request) -> web.Response:
    columns = request.app[_DATA].samples.as_columns(request.query.get("prefix", ""))
    return web.Response(body=jsonx.dumps(columns), content_type="application/json")


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def favicon(_request: web.Request) -> web.Response:
    return web.Response(status=204)


# ---- actions ---------------------------------------------------------------------------------------------------
def _field(form: Any, name: str, *, required: bool = True) -> str:
    value = form.get(name)
    text = value.strip() if isinstance(value, str) else ""
    if required and not text:
        raise ClientError(f"{name} is required")
    return text


def _int_field(form: Any, name: str, default: int | None = None) -> int:
    text = _field(form, name, required=default is None)
    if not text and default is not None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ClientError(f"{name} must be a whole number, got {text!r}") from None


async def _act(request: web.Request, back: str, action: Callable[[Any], Awaitable[str]]) -> web.Response:
    """Run an action on the posted form; its outcome (or why it was refused) is shown on ``back``."""
    session = _session(request)
    assert session is not None  # _access let only sessions through
    form = await request.post()
    try:
        outcome = await action(form)
    except (FerryError, ValueError, OSError) as exc:
        log.info("console action %s by %s refused: %s", request.path, session.user, exc)
        session.flash("error", f"refused: {exc}")
    else:
        log.info("console action %s by %s: %s", request.path, session.user, outcome)
        session.flash("ok", outcome)
    raise web.HTTPSeeOther(back)


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


async def topic_create(request: web.Request) -> web.Response:
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.create_topic(_field(form, "topic"), _int_field(form, "read_queue_nums", 8),
                                       _int_field(form, "write_queue_nums", 8), _int_field(form, "perm", 6),
                                       _field(form, "cluster", required=False) or None)
    return await _act(request, "/topics", go)


async def topic_update(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.update_topic(topic, _int_field(form, "read_queue_nums"),
                                       _int_field(form, "write_queue_nums"), _int_field(form, "perm"))
    return await _act(request, f"/topics/{_q(topic)}", go)


async def _require_typed_name(request: web.Request, kind: str, name: str, back: str) -> None:
    """A delete goes ahead only when the form's ``confirm`` field repeats the name; else back to ``back``
    with the reason."""
    form = await request.post()
    if form.get("confirm") != name:
        session = _session(request)
        assert session is not None
        session.flash("error", f"not deleted: type the {kind} name {name} to confirm")
        raise web.HTTPSeeOther(back)


async def topic_delete(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    acts = request.app[_ACTIONS]
    await _require_typed_name(request, "topic", topic, f"/topics/{_q(topic)}")

    async def go(_form: Any) -> str:
        return await acts.delete_topic(topic)
    return await _act(request, "/topics", go)


async def topic_send(request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.send_test(topic, str(form.get("body", "")), _field(form, "tags", required=False),
                                    _field(form, "keys", required=False))
    return await _act(request, f"/topics/{_q(topic)}", go)


async def group_create(request: web.Request) -> web.Response:
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.create_group(_field(form, "group"), _int_field(form, "retry_max_times", 16),
                                       form.get("broadcast") == "on")
    return await _act(request, "/groups", go)


async def group_delete(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    acts = request.app[_ACTIONS]
    await _require_typed_name(request, "group", group, f"/groups/{_q(group)}")

    async def go(_form: Any) -> str:
        return await acts.delete_group(group)
    return await _act(request, "/groups", go)


async def group_reset_offset(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        when = _field(form, "timestamp")
        try:
            ts = parse_time_ms(when, "reset")
        except PageError as exc:
            raise ClientError(exc.message) from None
        return await acts.reset_offset(group, _field(form, "topic"), ts)
    return await _act(request, f"/groups/{_q(group)}", go)


async def group_skip_backlog(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.skip_backlog(group, _field(form, "topic"))
    return await _act(request, f"/groups/{_q(group)}", go)


async def dlq_resend(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.resend_dlq(group, _field(form, "offset_msg_id"), form.get("target") == "original")
    return await _act(request, f"/groups/{_q(group)}/dlq", go)


async def broker_config_set(request: web.Request) -> web.Response:
    addr = request.match_info["addr"]
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        return await acts.set_broker_config(addr, _field(form, "key"), _field(form, "value", required=False))
    return await _act(request, f"/brokers/{_q(addr)}/config", go)


async def ha_elect(request: web.Request) -> web.Response:
    acts = request.app[_ACTIONS]

    async def go(form: Any) -> str:
        text = _field(form, "broker_id", required=False)
        return await acts.elect(_field(form, "broker_name"), _int_field(form, "broker_id") if text else None)
    return await _act(request, "/ha", go)


# ---- the application -------------------------------------------------------------------------------------------
def _body_text(body: bytes) -> str:
    """A message body as text for a page: UTF-8 (undecodable bytes replaced), cut at ``BODY_SHOWN_BYTES``."""
    if len(body) <= BODY_SHOWN_BYTES:
        return body.decode("utf-8", "replace")
    return (body[:BODY_SHOWN_BYTES].decode("utf-8", "replace")
            + f"\n… ({len(body) - BODY_SHOWN_BYTES} more bytes of {len(body)} not shown)")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("ferrymq.console", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["ms"] = fmt_ms
    env.filters["lagclass"] = lag_severity
    env.filters["replclass"] = replica_lag_severity
    env.filters["q"] = _q
    env.filters["body"] = _body_text
    env.globals["DLQ_PREFIX"] = DLQ_GROUP_TOPIC_PREFIX
    return env


def make_app(admin: Admin, *, sample_interval_s: float = SAMPLE_INTERVAL_S, auth: HttpAuth | None = None,
             users: dict[str, User] | None = None, controller_addrs: str = "", secure_cookie: bool = False,
             access: AccessConfig | None = None) -> web.Application:
    """The console application over a started ``Admin`` (the caller closes it). ``auth``: header credentials
    that may read; ``users``: the accounts that may log in (none: no log-in, no actions)."""
    if access is None:
        access = AccessConfig(header_auth=auth or HttpAuth(), users=dict(users or {}), secure_cookie=secure_cookie)
    app = web.Application(middlewares=[_errors, _access])
    data = ConsoleData(admin, controller_addrs=controller_addrs)
    actions = ConsoleActions(admin, data)
    app[_DATA] = data
    app[_ACTIONS] = actions
    app[_ACCESS] = access
    app[_ENV] = _environment()
    r = app.router
    r.add_get("/", cluster_page)
    r.add_get("/overview", overview_page)
    r.add_get("/topics", topics_page)
    r.add_post("/topics", topic_create)
    r.add_get("/topics/{topic}", topic_page)
    r.add_post("/topics/{topic}/update", topic_update)
    r.add_post("/topics/{topic}/delete", topic_delete)
    r.add_post("/topics/{topic}/send", topic_send)
    r.add_get("/groups", groups_page)
    r.add_post("/groups", group_create)
    r.add_get("/groups/{group}", group_page)
    r.add_post("/groups/{group}/delete", group_delete)
    r.add_post("/groups/{group}/reset-offset", group_reset_offset)
    r.add_post("/groups/{group}/skip-backlog", group_skip_backlog)
    r.add_get("/groups/{group}/dlq", dlq_page)
    r.add_post("/groups/{group}/dlq/resend", dlq_resend)
    r.add_get("/messages", messages_page)
    r.add_get("/producers", producers_page)
    r.add_get("/brokers/{addr}/config", broker_config_page)
    r.add_post("/brokers/{addr}/config", broker_config_set)
    r.add_get("/ha", ha_page)
    r.add_post("/ha/elect", ha_elect)
    r.add_get(LOGIN_PATH, login_page)
    r.add_post(LOGIN_PATH, login_submit)
    r.add_post("/logout", logout)
    r.add_get("/api/samples.json", samples_json)
    r.add_get("/healthz", healthz)
    r.add_get("/favicon.ico", favicon)
    r.add_static("/static", str(resources.files("ferrymq.console") / "static"))

    async def sampler(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(data.sample_forever(sample_interval_s), name="console-sampler")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await actions.close()

    app.cleanup_ctx.append(sampler)
    return app


async def serve(admin: Admin, host: str, port: int, *, sample_interval_s: float = SAMPLE_INTERVAL_S,
                auth: HttpAuth | None = None, users: dict[str, User] | None = None, controller_addrs: str = "",
                secure_cookie: bool = False) -> tuple[web.AppRunner, int]:
    """Start the console on host:port (0 = any free port); the runner (``await runner.cleanup()`` stops it)
    and the bound port."""
    app = make_app(admin, sample_interval_s=sample_interval_s, auth=auth, users=users,
                   controller_addrs=controller_addrs, secure_cookie=secure_cookie)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound


__all__ = ["AccessConfig", "Role", "make_app", "serve"]
