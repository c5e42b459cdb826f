"""Request signatures of RocketMQ 4.x ACL (sans-IO): what a client adds to a request and what a broker
recomputes to check it.

| extFields key | value                                                                     |
|---------------|---------------------------------------------------------------------------|
| AccessKey     | the account's access key                                                  |
| OnsChannel    | a channel name (clients send ``ALIYUN``; not checked)                     |
| Signature     | base64(HMAC-SHA1(secretKey, content)), see below                          |

content = the values (not the keys) of every extFields entry except ``Signature`` and ``_UNIQUE_KEY_QUERY``,
in the order of their keys sorted by UTF-16 code unit (Java ``TreeMap``; for the ASCII keys on the wire
that is plain string order), each as UTF-8, followed by the request body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
ONS_CHANNEL = "OnsChannel"
DEFAULT_CHANNEL = "ALIYUN"
#: extFields left out of the signed content besides Signature (RocketMQ's unique-key query flag)
UNSIGNED_KEYS = frozenset((SIGNATURE, "_UNIQUE_KEY_QUERY"))


def signed_content(ext_fields: Mapping[str, str], body: bytes) -> bytes:
    """The bytes a signature covers."""
    parts = [ext_fields[k].encode() for k in sorted(ext_fields) if k not in UNSIGNED_KEYS]
    parts.append(body)
    return b"".join(parts)


def signature(secret_key: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret_key.encode(), content, hashlib.sha1).digest()).decode()


def sign(ext_fields: dict[str, str], body: bytes, access_key: str, secret_key: str,
         channel: str = DEFAULT_CHANNEL) -> None:
    """Add AccessKey, OnsChannel and Signature to ``ext_fields`` (in place)."""
    ext_fields[ACCESS_KEY] = access_key
    ext_fields[ONS_CHANNEL] = channel
    ext_fields.pop(SIGNATURE, None)
    ext_fields[SIGNATURE] = signature(secret_key, signed_content(ext_fields, body))


def verify(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """Whether the request's Signature is right for ``secret_key`` (constant-time compare)."""
    given = ext_fields.get(SIGNATURE)
    if not given:
        return False
    expected = signature(secret_key, signed_content(ext_fields, body))
    return hmac.compare_digest(expected.encode(), given.encode())
