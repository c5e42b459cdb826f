"""Who may act in the console, over HTTP against an in-process name server and broker: without a session no
action (a page redirects to /login, a POST is 403), a read-only user sees no form and is refused (403), a POST
without the session's CSRF token or with a wrong one is refused (403), cross-site POSTs are refused; an admin's
POST acts and the effect is checked through the wire with the client. Without a users file the console offers
no action at all."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, CookieJar

from ferrymq.client import Admin
from ferrymq.common.http_auth import HttpAuth
from ferrymq.console import auth
from ferrymq.console.app import serve
from ferrymq.console.auth import Role, User
from ferrymq.errors import TopicNotExistError

CHEAP_N = 2 ** 4
USERS = {
    "alice": User("alice", Role.ADMIN, auth.hash_password("alice-pw", n=CHEAP_N)),
    "bob": User("bob", Role.READ_ONLY, auth.hash_password("bob-pw", n=CHEAP_N)),
}
TOKEN = "reader-token"
CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


class Browser:
    """A cookie-keeping HTTP client that does not follow redirects."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = ClientSession(cookie_jar=CookieJar(unsafe=True))

    async def get(self, path: str, **kw: Any) -> tuple[int, str, Any]:
        async with self.http.get(self.base + path, allow_redirects=False, **kw) as resp:
            return resp.status, await resp.text(), resp.headers

    async def post(self, path: str, data: dict[str, str], **kw: Any) -> tuple[int, str, Any]:
        async with self.http.post(self.base + path, data=data, allow_redirects=False, **kw) as resp:
            return resp.status, await resp.text(), resp.headers

    async def csrf(self, path: str = "/topics") -> str:
        status, page, _ = await self.get(path)
        assert status == 200, page
        found = CSRF_RE.search(page)
        assert found, "no form with a CSRF token on " + path
        return found.group(1)

    async def login(self, user: str, password: str) -> tuple[int, str, Any]:
        status, page, _ = await self.get("/login")
        assert status == 200
        token = CSRF_RE.search(page)
        assert token
        return await self.post("/login", {"csrf_token": token.group(1), "user": user, "password": password,
                                          "next": "/topics"})

    async def close(self) -> None:
        await self.http.close()


@pytest.fixture
async def console(namesrv: Any, broker: Any) -> AsyncIterator[tuple[str, Admin]]:
    async with Admin(namesrv.addr) as admin:
        runner, port = await serve(admin, "127.0.0.1", 0, sample_interval_s=60, users=USERS,
                                   auth=HttpAuth(token=TOKEN))
        try:
            yield f"http://127.0.0.1:{port}", admin
        finally:
            await runner.cleanup()


@pytest.fixture
async def browser(console: tuple[str, Admin]) -> AsyncIterator[Browser]:
    b = Browser(console[0])
    try:
        yield b
    finally:
        await b.close()


async def _topic_exists(admin: Admin, topic: str) -> bool:
    try:
        await admin.topic_route(topic)
    except TopicNotExistError:
        return False
    return True


async def test_without_a_session_pages_go_to_login_and_posts_are_refused(console: tuple[str, Admin],
                                                                      browser: Browser) -> None:
    _base, admin = console
    for path in ("/", "/overview", "/topics", "/groups/x", "/api/samples.json"):
        status, _, headers = await browser.get(path)
        assert status == 302, path
        assert headers["Location"].startswith("/login?next=")
    for path in ("/topics", "/topics/T/delete", "/groups", "/brokers/1.2.3.4:5/config", "/ha/elect"):
        status, page, _ = await browser.post(path, {"topic": "NoSessionT", "csrf_token": "x"})
        assert status == 403 and "log in first" in page, path
    assert not await _topic_exists(admin, "NoSessionT")
    status, _, _ = await browser.get("/healthz")
    assert status == 200
    status, _, _ = await browser.get("/static/uPlot.min.css")
    assert status == 200  # the log-in page's own files


async def test_login_sets_a_strict_httponly_cookie_and_logout_ends_it(browser: Browser) -> None:
    status, page, _ = await browser.login("alice", "wrong")
    assert status == 401 and "wrong user name or password" in page
    status, page, _ = await browser.login("nobody", "alice-pw")
    assert status == 401
    status, _, headers = await browser.login("alice", "alice-pw")
    assert status == 303 and headers["Location"] == "/topics"
    cookie = next(c for c in headers.getall("Set-Cookie") if c.startswith("ferrymq_session="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    status, page, _ = await browser.get("/topics")
    assert status == 200 and "alice (admin)" in page and 'id="create-topic"' in page
    token = await browser.csrf()
    status, _, headers = await browser.post("/logout", {"csrf_token": token})
    assert status == 303
    status, _, _ = await browser.get("/topics")
    assert status == 302


async def test_the_login_form_needs_its_own_token(browser: Browser) -> None:
    status, page, _ = await browser.post("/login", {"user": "alice", "password": "alice-pw"})
    assert status == 403 and "log-in form token" in page


async def test_an_admin_acts_only_with_the_csrf_token(console: tuple[str, Admin], browser: Browser) -> None:
    _base, admin = console
    await browser.login("alice", "alice-pw")
    form = {"topic": "CsrfT", "read_queue_nums": "2", "write_queue_nums": "2", "perm": "6"}
    status, page, _ = await browser.post("/topics", form)
    assert status == 403 and "CSRF" in page
    status, page, _ = await browser.post("/topics", dict(form, csrf_token="wrong"))
    assert status == 403 and "CSRF" in page
    token = await browser.csrf()
    status, page, _ = await browser.post("/topics", dict(form, csrf_token=token),
                                         headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in page
    assert not await _topic_exists(admin, "CsrfT")
    status, _, headers = await browser.post("/topics", dict(form, csrf_token=token))
    assert status == 303 and headers["Location"] == "/topics"
    route = await admin.wait_for_route("CsrfT")
    assert route.queue_datas[0].write_queue_nums == 2
    status, page, _ = await browser.get("/topics")
    assert "topic CsrfT created on 1 master(s)" in page  # the outcome, shown once
    status, page, _ = await browser.get("/topics")
    assert "topic CsrfT created" not in page


async def test_a_refused_action_shows_why(browser: Browser) -> None:
    await browser.login("alice", "alice-pw")
    token = await browser.csrf()
    status, _, _ = await browser.post("/topics", {"topic": "bad topic!", "csrf_token": token})
    assert status == 303
    status, page, _ = await browser.get("/topics")
    assert 'class="flash error"' in page and "refused:" in page


async def test_a_read_only_user_sees_no_form_and_cannot_write(console: tuple[str, Admin], browser: Browser,
                                                             broker: Any) -> None:
    _base, admin = console
    status, _, _ = await browser.login("bob", "bob-pw")
    assert status == 303
    for path in ("/topics", "/groups", f"/brokers/{broker.broker_addr}/config"):
        status, page, _ = await browser.get(path)
        assert status == 200 and "bob (read-only)" in page
        assert 'action="/topics"' not in page and 'id="create-group"' not in page and 'id="set-config"' not in page
    token = await browser.csrf("/overview")  # the log-out form's token
    status, page, _ = await browser.post("/topics", {"topic": "ReadOnlyT", "csrf_token": token})
    assert status == 403 and "read-only" in page
    status, page, _ = await browser.post(f"/brokers/{broker.broker_addr}/config",
                                         {"key": "fileReservedTime", "value": "1", "csrf_token": token})
    assert status == 403
    assert not await _topic_exists(admin, "ReadOnlyT")
    status, _, _ = await browser.post("/logout", {"csrf_token": token})
    assert status == 303


async def test_header_credentials_read_but_never_act(browser: Browser) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    status, page, _ = await browser.get("/topics", headers=headers)
    assert status == 200 and 'id="create-topic"' not in page
    status, _, _ = await browser.post("/topics", {"topic": "HeaderT"}, headers=headers)
    assert status == 403


async def test_failed_logins_are_throttled(browser: Browser) -> None:
    for _ in range(auth.MAX_LOGIN_FAILURES):
        status, _, _ = await browser.login("alice", "guess")
        assert status == 401
    status, page, _ = await browser.login("alice", "alice-pw")
    assert status == 429 and "too many failed log-ins" in page


async def test_without_a_users_file_nothing_is_offered_or_done(namesrv: Any, broker: Any) -> None:
    async with Admin(namesrv.addr) as admin:
        runner, port = await serve(admin, "127.0.0.1", 0, sample_interval_s=60)
        b = Browser(f"http://127.0.0.1:{port}")
        try:
            status, page, _ = await b.get("/topics")
            assert status == 200 and "csrf_token" not in page and "Log in" not in page
            status, page, _ = await b.post("/topics", {"topic": "NoUsersT"})
            assert status == 403 and "read-only" in page
            status, _, _ = await b.get("/login")
            assert status == 404
            assert not await _topic_exists(admin, "NoUsersT")
        finally:
            await b.close()
            await runner.cleanup()


@pytest.mark.parametrize(("given", "landing"), [
    ("/topics", "/topics"), ("/groups/g?x=1", "/groups/g?x=1"), (None, "/overview"), ("", "/overview"),
    ("https://evil.example/", "/overview"), ("//evil.example", "/overview"), ("/\\evil.example", "/overview"),
    ("/\t/evil.example", "/overview"), ("/\n/evil.example", "/overview"), ("topics", "/overview"),
])
def test_log_in_lands_only_on_a_local_page(given: str | None, landing: str) -> None:
    from ferrymq.console.app import _safe_next

    assert _safe_next(given) == landing


def test_long_bodies_are_cut_on_pages() -> None:
    from ferrymq.console.app import BODY_SHOWN_BYTES, _body_text

    assert _body_text(b"caf\xc3\xa9 \xff") == "café \ufffd"
    text = _body_text(b"x" * (BODY_SHOWN_BYTES + 10))
    assert text.startswith("x" * BODY_SHOWN_BYTES) and text.endswith(f"(10 more bytes of {BODY_SHOWN_BYTES + 10} not shown)")
