"""HA peer authentication (a ferrymq extension of the classic HA protocol). Sans-IO.

When the master's broker.conf sets ``haSecret``, a connection to its HA port must prove, before anything
else, that it knows the group's secret; until it has, the master sends it nothing and none of its offset
reports count (an impostor can never release a SYNC_MASTER send). A master without ``haSecret`` speaks the
plain RocketMQ 4.x protocol, so RocketMQ slaves keep working there; a slave with ``haSecret`` needs a master
with the same secret.

| step | direction      | bytes | field                                                                   |
|------|----------------|-------|-------------------------------------------------------------------------|
| 1    | master > slave | 4     | magic ``FMQA``                                                          |
|      |                | 1     | version (1)                                                             |
|      |                | 16    | nonce (``secrets.token_bytes``), new for every connection              |
| 2    | slave > master | 4     | magic ``FMQR``                                                          |
|      |                | 32    | HMAC-SHA256(haSecret, ``"ferrymq-ha-auth-v1" 0x00 brokerName 0x00 nonce``) |
| 3    | both           |       | the classic protocol: 8-byte reports up, 12-byte-header transfers down  |

The brokerName in the MAC binds the proof to one broker group (a slave of another group with the same
secret cannot join). The master compares in constant time (``hmac.compare_digest``) and closes a connection
whose proof is wrong or does not arrive within ``AUTH_TIMEOUT_MS``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

CHALLENGE_MAGIC = b"FMQA"
RESPONSE_MAGIC = b"FMQR"
AUTH_VERSION = 1
NONCE_BYTES = 16
CHALLENGE = struct.Struct(">4sB16s")
RESPONSE = struct.Struct(">4s32s")
#: a connection must prove itself within this, or the master closes it
AUTH_TIMEOUT_MS = 5_000
_CONTEXT = b"ferrymq-ha-auth-v1"


class HAAuthError(Exception):
    """A handshake frame that is not what this protocol version sends."""


def new_challenge() -> tuple[bytes, bytes]:
    """(nonce, the challenge frame the master sends first)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce, CHALLENGE.pack(CHALLENGE_MAGIC, AUTH_VERSION, nonce)


def _mac(secret: str, broker_name: str, nonce: bytes) -> bytes:
    message = _CONTEXT + b"\0" + broker_name.encode("utf-8") + b"\0" + nonce
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()


def response_to(challenge: bytes, secret: str, broker_name: str) -> bytes:
    """The slave's answer to a challenge frame; HAAuthError when it is not a challenge."""
    if len(challenge) != CHALLENGE.size:
        raise HAAuthError(f"challenge of {len(challenge)} bytes, expected {CHALLENGE.size}")
    magic, version, nonce = CHALLENGE.unpack(challenge)
    if magic != CHALLENGE_MAGIC or version != AUTH_VERSION:
        raise HAAuthError("the master did not send an HA authentication challenge (is haSecret set on it?)")
    return RESPONSE.pack(RESPONSE_MAGIC, _mac(secret, broker_name, nonce))


def verify(response: bytes, secret: str, broker_name: str, nonce: bytes) -> bool:
    """Whether ``response`` proves knowledge of ``secret`` for this group and this nonce."""
    if len(response) != RESPONSE.size:
        return False
    magic, mac = RESPONSE.unpack(response)
    return magic == RESPONSE_MAGIC and hmac.compare_digest(mac, _mac(secret, broker_name, nonce))
