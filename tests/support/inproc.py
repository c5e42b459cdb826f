"""In-process NameServer + BrokerController on 127.0.0.1 (port 0), data under the test's tmp_path.

A pytest plugin (``tests/conftest.py`` loads it), giving every suite the fixtures

* ``namesrv``: a started NameServer, stopped at teardown;
* ``broker``: a started BrokerController registered with ``namesrv``, stopped at teardown; its config is
  ``broker_config(<tmp>/store, namesrv.addr, **broker_settings)``;
* ``broker_settings``: per-suite config values (``{}`` here; a suite's conftest overrides it).

ferrymq.broker / ferrymq.namesrv are imported lazily, so suites that do not use them never import them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from support.ports import LOOPBACK


def _cluster_available() -> bool:
    try:
        import ferrymq.broker.app  # noqa: F401
        import ferrymq.namesrv.app  # noqa: F401
    except Exception:
        return False
    return True


needs_cluster = pytest.mark.skipif(not _cluster_available(), reason="broker/namesrv not importable")


#: commit log preallocation of in-process test brokers (a ``settings`` key overrides it)
TEST_COMMIT_LOG_PREALLOCATION = "sparse"


def broker_config(data_dir: str, namesrv: str | None = None, **settings: Any) -> Any:
    """A BrokerConfig serving on a free loopback port (no fast channel) with its store in ``data_dir``;
    ``settings`` are further BrokerConfig fields."""
    from ferrymq.broker.config import BrokerConfig

    cfg = BrokerConfig(
        listen_port=0,
        listen_host=LOOPBACK,
        broker_ip1=LOOPBACK,
        store_path_root_dir=data_dir,
        namesrv_addr=[namesrv] if namesrv else [],
        fast_listen_enable=False,
        # a test broker writes little: a sparse commit log segment takes the disk its data needs, where the
        # default (warm) zero-fills 1 GiB per broker, which pytest's kept tmp dirs add up to tens of GB
        commit_log_preallocation=TEST_COMMIT_LOG_PREALLOCATION,
    )
    for k, v in settings.items():
        setattr(cfg, k, v)
    return cfg


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
async def namesrv() -> AsyncIterator[Any]:
    from ferrymq.namesrv.app import NameServer

    ns = NameServer(LOOPBACK, 0)
    await ns.start()
    try:
        yield ns
    finally:
        await ns.stop()


@pytest.fixture
async def broker(tmp_path: Path, namesrv: Any, broker_settings: dict[str, Any]) -> AsyncIterator[Any]:
    from ferrymq.broker.app import BrokerController

    ctl = BrokerController(broker_config(str(tmp_path / "store"), namesrv.addr, **broker_settings))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()
