"""Fixtures of the gRPC suite: the real RocketMQ 5.x Python SDK in its own directory, and a name server,
broker and gRPC proxy in the test's event loop.

The SDK (PyPI ``rocketmq-python-client``) has the import name ``rocketmq``, which is also the 4.x C++
client's (``rocketmq==0.4.4``, used by the acceptance suite), so it is installed with ``pip --target`` into
a cache directory of its own and runs in subprocesses (``sdk5_driver.py``) with PYTHONPATH naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sdk5_support import DRIVER, SDK_EXIT_GRACE_S

from support.aio import wait_for
from support.pip_target import PipTargetError, pip_target_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "acceptance"))
from procs import ProcessGroup  # noqa: E402

SDK_REQUIREMENT = "rocketmq-python-client==5.1.2"
#: pip's time to install the SDK and its dependencies
SDK_INSTALL_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def sdk5_path() -> Path:
    """Directory holding the 5.x SDK and its dependencies (installed once, then reused: support/pip_target.py)."""
    try:
        return pip_target_dir(SDK_REQUIREMENT, timeout_s=SDK_INSTALL_TIMEOUT_S)
    except PipTargetError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def proxy_settings() -> dict[str, Any]:
    """ProxyConfig fields of the suite's proxy (a test overrides it)."""
    return {}


@dataclass
class GrpcStack:
    namesrv: Any
    broker: Any
    proxy: Any
    sdk_path: Path
    home: Path
    #: extra environment of the SDK processes (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH for TLS)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def endpoints(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        from ferrymq.client.admin import Admin

        async with Admin(self.namesrv.addr) as admin:
            await admin.create_topic(topic, broker_addr=self.broker.broker_addr, read_queue_nums=queues,
                                     write_queue_nums=queues)
        await wait_for(lambda: self._has_route(topic), timeout_s=10, what=f"route of {topic}")

    async def _has_route(self, topic: str) -> bool:
        try:
            await self.proxy.service.instance.update_route(topic)
        except Exception:
            return False
        return True

    async def sdk(self, verb: str, *, timeout_s: float = 60, check: bool = True, **args: Any) -> list[dict[str, Any]]:
        """Run one driver verb to its end (the driver stops itself after ``timeout_s``; the process is
        killed SDK_EXIT_GRACE_S later); its JSON records (the last one is the ``done`` summary, asserted
        successful unless ``check`` is False)."""
        out = self.home / f"{verb}-{uuid.uuid4().hex[:8]}.jsonl"
        args = {"verb": verb, "endpoints": self.endpoints, "out": str(out), "timeout_s": timeout_s, **args}
        env = {**os.environ, "PYTHONPATH": str(self.sdk_path), "HOME": str(self.home), **self.env}
        proc = await asyncio.create_subprocess_exec(sys.executable, str(DRIVER), json.dumps(args), env=env,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout_s + SDK_EXIT_GRACE_S)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        if not check:
            return records
        assert records and records[-1].get("done"), (
            f"SDK {verb} failed (exit {proc.returncode}): {records[-3:]} {stderr.decode()[-2000:]}")
        return records


@pytest.fixture
async def proxy_server(broker: Any, namesrv: Any, proxy_settings: dict[str, Any]) -> AsyncIterator[Any]:
    """A started gRPC proxy in front of the ``broker`` fixture (any free port)."""
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.server import ProxyServer

    proxy = ProxyServer(ProxyConfig(namesrv.addr, listen_port=0, **proxy_settings))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
async def grpc_stack(sdk5_path: Path, tmp_path: Path, broker: Any, namesrv: Any,
                     proxy_server: Any) -> AsyncIterator[GrpcStack]:
    home = tmp_path / "home"
    home.mkdir()
    yield GrpcStack(namesrv, broker, proxy_server, sdk5_path, home)


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessGroup]:
    """Processes a test starts (name servers, brokers, proxies, SDK drivers), all stopped at its end; their logs
    are printed when the test failed."""
    group = ProcessGroup(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(group.dump())
