"""HttpAuth (common/http_auth.py): which Authorization values pass, and that every comparison is a
constant-time one of equal-length digests (checked by watching hmac.compare_digest, not by timing)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ferrymq.common import http_auth
from ferrymq.common.http_auth import HttpAuth, check_basic, check_token, is_loopback


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def test_nothing_configured_lets_everything_pass() -> None:
    assert not HttpAuth().required
    assert HttpAuth().allows(None) and HttpAuth().allows("Bearer whatever")


@pytest.mark.parametrize(("header", "ok"), [
    (None, False), ("", False), ("Bearer", False), ("Bearer s3cret", True), ("bearer s3cret", True),
    ("BEARER  s3cret ", True), ("Bearer s3cre", False), ("Bearer s3cret2", False), ("Bearer S3CRET", False),
    ("Token s3cret", False), ("s3cret", False), (basic("user:s3cret"), False),
    (b"Bearer s3cret", True),
])
def test_bearer_token(header: Any, ok: bool) -> None:
    assert HttpAuth(token="s3cret").allows(header) is ok


@pytest.mark.parametrize(("header", "ok"), [
    (basic("ops:pa:ss"), True), (basic("ops:pa:s"), False), (basic("ops2:pa:ss"), False), ("Basic !!!", False),
    ("Basic " + base64.b64encode(b"\xff\xfe").decode(), False), ("Bearer ops:pa:ss", False), (None, False),
])
def test_basic_credentials(header: str | None, ok: bool) -> None:
    assert HttpAuth(basic="ops:pa:ss").allows(header) is ok


def test_either_credential_passes_when_both_are_set() -> None:
    auth = HttpAuth(token="t0ken", basic="ops:pw")
    assert auth.allows("Bearer t0ken") and auth.allows(basic("ops:pw"))
    assert not auth.allows("Bearer pw") and not auth.allows(basic("ops:t0ken"))
    assert auth.challenge().startswith("Basic ") and HttpAuth(token="x").challenge().startswith("Bearer ")


def test_every_comparison_is_constant_time_over_equal_length_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = http_auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_auth.hmac, "compare_digest", spy)
    auth = HttpAuth(token="a-rather-long-token", basic="ops:pw")
    for header in (None, "Bearer a", "Bearer a-rather-long-token-and-more", "Bearer a-rather-long-token",
                   basic("ops:pw"), "Basic !!!", "Digest x"):
        calls.clear()
        auth.allows(header)
        # both configured credentials compared, whatever was presented, as 32-byte digests
        assert len(calls) == 2, header
        assert all(len(a) == len(b) == 32 for a, b in calls), header


def test_credentials_that_cannot_travel_in_a_header_are_refused() -> None:
    for bad in ("with space", "tab\tbed", "nl\n", "é"):
        with pytest.raises(ValueError):
            check_token(bad)
    for bad in ("nocolon", ":pw", "ops:p\nw"):
        with pytest.raises(ValueError):
            check_basic(bad)
    with pytest.raises(ValueError):
        HttpAuth(basic="nocolon")
    assert check_basic("ops:") == "ops:"


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
