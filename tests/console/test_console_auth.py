"""Who may read the console (issue 25 item 6): with --auth-token / --basic-auth every page but /healthz is 401
without the credentials, 200 with them; the command line refuses credentials that cannot travel in a header
and warns about a non-loopback address without any."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession

from ferrymq.client import Admin
from ferrymq.common.http_auth import HttpAuth
from ferrymq.console.app import serve

TOKEN = "c0nsole-token"
BASIC = "ops:pa ss:word"


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


@pytest.fixture
async def console(namesrv: Any, broker: Any) -> AsyncIterator[tuple[str, ClientSession]]:
    async with Admin(namesrv.addr) as admin:
        runner, port = await serve(admin, "127.0.0.1", 0, sample_interval_s=0.2,
                                   auth=HttpAuth(token=TOKEN, basic=BASIC))
        try:
            async with ClientSession() as session:
                yield f"http://127.0.0.1:{port}", session
        finally:
            await runner.cleanup()


async def test_pages_need_the_credentials(console: tuple[str, ClientSession]) -> None:
    base, session = console
    paths = ("/", "/topics", "/groups", "/messages", "/api/samples.json", "/static/uPlot.min.css", "/nope")
    for path in paths:
        for header in (None, "Bearer wrong", f"Bearer {TOKEN[:-1]}", TOKEN, basic("ops:wrong"), "Basic !!"):
            headers = {"Authorization": header} if header is not None else {}
            async with session.get(base + path, headers=headers) as resp:
                assert resp.status == 401, (path, header)
                assert resp.headers["WWW-Authenticate"] == 'Basic realm="ferrymq"'
                assert "ConsoleT" not in await resp.text()
    for header in (f"Bearer {TOKEN}", basic(BASIC)):
        for path in ("/", "/topics", "/groups"):
            async with session.get(base + path, headers={"Authorization": header}) as resp:
                assert resp.status == 200, (path, header)
    async with session.get(base + "/healthz") as resp:  # liveness probes need no credentials
        assert resp.status == 200 and await resp.text() == "ok"


def _ferry_console(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferrymq.cli", "console", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=env)


@pytest.mark.parametrize("args", [("--basic-auth", "nocolon"), ("--basic-auth", ":pw"),
                                  ("--auth-token", "two words")])
def test_credentials_that_cannot_travel_are_a_usage_error(args: tuple[str, str]) -> None:
    cp = _ferry_console(*args)
    assert cp.returncode == 2, cp.stderr
    assert args[0] in cp.stderr and args[1] not in cp.stderr and "Traceback" not in cp.stderr


def test_hash_password_writes_an_entry_the_console_loads(tmp_path: Any) -> None:
    from ferrymq.console.auth import Role, load_users, verify_password

    cp = subprocess.run([sys.executable, "-m", "ferrymq.cli", "console", "hash-password", "-u", "ops", "--role",
                         "admin", "--password-stdin"], input="long pass phrase\n", capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "long pass phrase" not in cp.stdout
    path = tmp_path / "users.yml"
    path.write_text("users:\n" + cp.stdout)
    user = load_users(path)["ops"]
    assert user.role is Role.ADMIN and verify_password("long pass phrase", user.password_hash)


@pytest.mark.parametrize(("content", "needle"), [(None, "cannot read"), ("users:\n  ops: {role: admin, password: pw}\n",
                                                                         "user 'ops'")])
def test_a_bad_users_file_is_a_usage_error(tmp_path: Any, content: str | None, needle: str) -> None:
    path = tmp_path / "users.yml"
    if content is not None:
        path.write_text(content)
    cp = _ferry_console("--users-file", str(path), "--listen", "127.0.0.1:0")
    assert cp.returncode == 2 and "--users-file" in cp.stderr and needle in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr
