"""The Python example in README.md runs as written against a live name server + broker."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import threading
from pathlib import Path

import pytest

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import BrokerConfig
from ferrymq.namesrv.app import NameServer

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_python_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    snippet = next(b for b in blocks if "from ferrymq.client import" in b)
    return snippet


@pytest.mark.timeout(120)
def test_readme_client_snippet_round_trip(tmp_path: Path) -> None:
    ready = threading.Event()
    stop = threading.Event()
    addr: list[str] = []

    async def serve() -> None:
        async with NameServer() as ns:
            cfg = BrokerConfig(listen_port=0, listen_host="127.0.0.1", broker_ip1="127.0.0.1",
                               store_path_root_dir=str(tmp_path / "store"), namesrv_addr=[ns.addr],
                               mapped_file_size_commit_log=4 * 1024 * 1024, fast_listen_enable=False)
            async with BrokerController(cfg):
                addr.append(ns.addr)
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

    server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    server.start()
    try:
        assert ready.wait(30), "in-process cluster did not start"
        code = readme_python_snippet().replace("127.0.0.1:9876", addr[0])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        printed = out.getvalue()
        assert "SendStatus.SEND_OK" in printed
        assert "[b'hello']" in printed
    finally:
        stop.set()
        server.join(30)
