"""A minimal Chrome DevTools Protocol driver for headless Chromium (Debian's ``chromium``): start it on a free
debugging port, open a page, type into inputs, click, wait for navigation, read the DOM. Enough for the
console's browser test: one browser session drives many actions, as an operator's would.

Uses aiohttp's WebSocket client (already a dependency) and only these CDP methods: Target.createTarget,
Target.attachToTarget (flat sessions), Page.enable / Page.navigate / Page.loadEventFired, Runtime.evaluate,
Network.setCookie is not needed (the browser keeps its cookies).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

#: how long one page load or one evaluation may take
STEP_TIMEOUT_S = 30.0
DEVTOOLS_RE = re.compile(r"DevTools listening on (ws://\S+)")


class CdpError(AssertionError):
    pass


class Chromium:
    """``async with Chromium(binary, flags, profile_dir) as browser: page = await browser.new_page()``."""

    def __init__(self, binary: str, flags: list[str], profile_dir: Path) -> None:
        self.binary, self.flags, self.profile_dir = binary, flags, profile_dir
        self.proc: subprocess.Popen[str] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Chromium:
        self.proc = subprocess.Popen(
            [self.binary, *self.flags, "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = await asyncio.to_thread(self._devtools_url)
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        return self

    def _devtools_url(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + STEP_TIMEOUT_S
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = DEVTOOLS_RE.search(line)
            if found:
                return found.group(1)
        raise CdpError("chromium printed no DevTools address:\n" + "".join(lines[-20:]))

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.proc is not None:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
            if self.proc.stderr is not None:
                self.proc.stderr.close()

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            obj = json.loads(msg.data)
            if "id" in obj:
                fut = self._pending.pop(obj["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(obj)
            elif "method" in obj:
                for fut in self._events.pop(obj["method"], []):
                    if not fut.done():
                        fut.set_result(obj)

    async def send(self, method: str, params: dict[str, Any] | None = None, session_id: str | None = None
                   ) -> dict[str, Any]:
        assert self.ws is not None
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        frame: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session_id:
            frame["sessionId"] = session_id
        await self.ws.send_str(json.dumps(frame))
        resp = await asyncio.wait_for(fut, STEP_TIMEOUT_S)
        if "error" in resp:
            raise CdpError(f"{method}: {resp['error']}")
        result: dict[str, Any] = resp.get("result", {})
        return result

    def event(self, method: str) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._events.setdefault(method, []).append(fut)
        return fut

    async def new_page(self) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        return page


class Page:
    def __init__(self, browser: Chromium, session_id: str) -> None:
        self.browser, self.session_id = browser, session_id

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session_id)

    async def goto(self, url: str) -> None:
        loaded = self.browser.event("Page.loadEventFired")
        await self.send("Page.navigate", {"url": url})
        await asyncio.wait_for(loaded, STEP_TIMEOUT_S)

    async def eval(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def html(self) -> str:
        return str(await self.eval("document.documentElement.outerHTML"))

    async def text(self) -> str:
        return str(await self.eval("document.body.innerText"))

    async def url(self) -> str:
        return str(await self.eval("location.href"))

    async def fill(self, selector: str, value: str) -> None:
        """Set an input's or select's value as typing would (an ``input`` and a ``change`` event)."""
        ok = await self.eval(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return false;"
            f" el.value = {json.dumps(value)}; el.dispatchEvent(new Event('input', {{bubbles: true}}));"
            f" el.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()")
        if not ok:
            raise CdpError(f"no element {selector} on {await self.url()}")

    async def click(self, selector: str, *, navigates: bool = True) -> None:
        """Click an element (a submit button: the form is posted and the next page loaded)."""
        loaded = self.browser.event("Page.loadEventFired") if navigates else None
        ok = await self.eval(f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
                             f" if (!el) return false; el.click(); return true; }})()")
        if not ok:
            raise CdpError(f"no element {selector} on {await self.url()}")
        if loaded is not None:
            await asyncio.wait_for(loaded, STEP_TIMEOUT_S)

    async def submit(self, form_selector: str, values: dict[str, str]) -> str:
        """Fill a form's fields (by name), click its submit button, wait for the next page; its text."""
        for name, value in values.items():
            await self.fill(f"{form_selector} [name={json.dumps(name)}]", value)
        await self.click(f"{form_selector} button[type=submit]")
        return await self.text()

    async def status_of(self, method: str, path: str, body: dict[str, str] | None = None) -> tuple[int, str]:
        """What the page's own origin gets for a fetch (with its cookies): (status, text)."""
        body_js = json.dumps(body) if body is not None else "null"
        value = await self.eval(
            f"(async () => {{ const b = {body_js}; const init = {{method: {json.dumps(method)}, redirect: 'manual',"
            f" credentials: 'same-origin'}}; if (b !== null) init.body = new URLSearchParams(b);"
            f" const r = await fetch({json.dumps(path)}, init); return [r.status, await r.text()]; }})()")
        return int(value[0]), str(value[1])
