"""Who may read the broker's metrics endpoint and the console: a bearer token and/or basic-auth credentials,
compared in constant time. Sans-IO: the HTTP servers hand over the ``Authorization`` header's value.

| ``Authorization`` header value        | accepted when                                                   |
|---------------------------------------|-----------------------------------------------------------------|
| ``Bearer <token>``                    | a token is configured and ``<token>`` equals it                 |
| ``Basic <base64(user ":" password)>`` | basic credentials are configured and ``user:password`` equal them |

Nothing configured: every request passes (both servers bind 127.0.0.1 unless told otherwise). Both
configured: either passes. The scheme name is case-insensitive (RFC 9110). Each presented value is compared
with each configured one as SHA-256 digests through ``hmac.compare_digest``, every configured credential
every time: the time taken shows neither the configured length nor how much of a guess was right.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

__all__ = ["HttpAuth", "REALM", "check_basic", "check_token", "is_loopback"]

REALM = "ferrymq"


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def check_token(token: str) -> str:
    """``token`` as configured, or ValueError with the reason (it must fit in one header token)."""
    if any(c.isspace() or not c.isprintable() or ord(c) > 0x7E for c in token):
        raise ValueError("must be printable ASCII without spaces")
    return token


def check_basic(credentials: str) -> str:
    """``user:password`` as configured, or ValueError with the reason."""
    user, sep, _password = credentials.partition(":")
    if not sep or not user:
        raise ValueError("must be user:password")
    if any(not c.isprintable() for c in credentials):
        raise ValueError("must not hold control characters")
    return credentials


def is_loopback(host: str) -> bool:
    """Is ``host`` (an IP address, or ``localhost``) reachable from this machine only?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class HttpAuth:
    """The credentials a server accepts; empty strings: that kind is off."""

    token: str = ""
    basic: str = ""  # "user:password"

    def __post_init__(self) -> None:
        if self.token:
            check_token(self.token)
        if self.basic:
            check_basic(self.basic)

    @property
    def required(self) -> bool:
        return bool(self.token or self.basic)

    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401 (browsers prompt for basic credentials)."""
        return f'Basic realm="{REALM}"' if self.basic else f'Bearer realm="{REALM}"'

    def allows(self, authorization: str | bytes | None) -> bool:
        """May a request with this ``Authorization`` header value (None: absent) pass?"""
        if not self.required:
            return True
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        scheme, _, value = (authorization or "").strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        presented_token = value.encode("latin-1", "replace") if scheme == "bearer" else None
        presented_basic: bytes | None = None
        if scheme == "basic":
            try:
                presented_basic = base64.b64decode(value.encode("ascii", "replace"), validate=True)
            except (binascii.Error, ValueError):
                presented_basic = None
        ok = False
        # every configured credential is compared, whatever the scheme, so the time taken tells nothing
        for configured, presented in ((self.token, presented_token), (self.basic, presented_basic)):
            if not configured:
                continue
            same = hmac.compare_digest(_digest(configured.encode("utf-8")), _digest(presented or b"\0"))
            ok |= same and presented is not None
        return ok
