"""Who may scrape the broker's metrics (issue 25 item 6): the endpoint binds metricsListenHost (127.0.0.1 by
default, whatever listenHost says); with metricsAuthToken / metricsBasicAuth a scrape without the right
Authorization header is 401; the credentials never leave the broker through GET_BROKER_CONFIG."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from broker_helpers import BROKER_SETTINGS, Client, make_config

from ferrymq.broker.app import BrokerController
from ferrymq.broker.config import from_properties
from ferrymq.errors import ConfigError
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

TOKEN = "scrape-t0ken"
BASIC = "prom:pa:ss"


async def http_get(port: int, authorization: str | None = None) -> tuple[int, bytes, bytes]:
    """(status, head, body) of GET /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        extra = f"Authorization: {authorization}\r\n" if authorization is not None else ""
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


@pytest.fixture
def broker_settings() -> dict[str, Any]:
    # listenHost 0.0.0.0: the metrics endpoint must still bind loopback only
    return {**BROKER_SETTINGS, "listen_host": "0.0.0.0", "metrics_port": 0, "metrics_auth_token": TOKEN,
            "metrics_basic_auth": BASIC}


async def test_scrapes_need_the_token_or_the_basic_credentials(broker: BrokerController) -> None:
    srv = broker.metrics_server
    assert srv is not None and srv._server is not None
    assert {s.getsockname()[0] for s in srv._server.sockets} == {"127.0.0.1"}
    port = srv.port
    for header in (None, "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", TOKEN,
                   "Basic " + base64.b64encode(b"prom:wrong").decode()):
        status, head, body = await http_get(port, header)
        assert status == 401, header
        assert b"WWW-Authenticate: Basic realm=" in head and b"ferrymq_" not in body
    for header in (f"Bearer {TOKEN}", "Basic " + base64.b64encode(BASIC.encode()).decode()):
        status, _head, body = await http_get(port, header)
        assert status == 200 and b"ferrymq_long_poll_waiters" in body, header


async def test_broker_config_never_shows_the_credentials(broker: BrokerController) -> None:
    client = await Client().open(broker.broker_addr)
    try:
        resp = await client.call(RequestCode.GET_BROKER_CONFIG)
        assert resp.code == R.SUCCESS
        text = resp.body.decode()
        assert TOKEN not in text and "pa:ss" not in text
        assert "metricsAuthToken=******" in text and "metricsListenHost=127.0.0.1" in text
    finally:
        client.close()


def test_default_is_loopback_without_credentials(tmp_path: Any) -> None:
    cfg = make_config(str(tmp_path))
    assert (cfg.metrics_listen_host, cfg.metrics_auth_token, cfg.metrics_basic_auth) == ("127.0.0.1", "", "")


@pytest.mark.parametrize(("key", "value"), [("metricsListenHost", "metrics.example"), ("metricsListenHost", ""),
                                            ("metricsAuthToken", "two words"), ("metricsBasicAuth", "nocolon"),
                                            ("metricsBasicAuth", ":pw")])
def test_bad_values_are_config_errors_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        from_properties({key: value})
    assert exc.value.key == key
    if key != "metricsListenHost":  # a secret is not echoed
        assert value not in str(exc.value)
