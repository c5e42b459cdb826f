"""Console log-in: accounts read from a users file, passwords hashed with scrypt, server-side sessions with a
per-session CSRF token, and the two roles. Sans-IO: the clock is passed in, nothing here touches a socket.

The users file (``ferry console --users-file users.yml``; entries written by ``ferry console hash-password``):

```yaml
users:
  alice: {role: admin, password: "scrypt$16384$8$1$<salt, base64>$<key, base64>"}
  bob: {role: read-only, password: "scrypt$..."}
```

| field      | meaning                                                                                |
|------------|----------------------------------------------------------------------------------------|
| (key)      | the user name typed at the log-in form (printable, no spaces, at most 64 characters)   |
| role       | ``admin`` (sees and acts) or ``read-only`` (sees)                                      |
| password   | ``scrypt$N$r$p$salt$key``: hashlib.scrypt of the UTF-8 password with a random 16-byte  |
|            | salt per user, key length 32; N, r, p as written (N a power of two)                    |

A plain-text password, another hash scheme or an unknown role is refused when the file is loaded (ValueError
naming the user): the console does not start with an account it cannot check safely.

Sessions live in the console's memory (a restart logs everyone out). A session id is 256 random bits
(``secrets``); the cookie carrying it is HttpOnly and SameSite=Strict. A session ends ``SESSION_IDLE_S``
after its last request or ``SESSION_MAX_S`` after log-in, whichever comes first. Each session has its own CSRF
token, embedded in every form and compared in constant time with the one a POST carries.
"""

from __future__ import annotations

import base64
import binascii
import collections
import enum
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["LoginThrottle", "Role", "Session", "SessionStore", "User", "hash_password", "load_users",
           "parse_users", "verify_password"]

#: scrypt cost of new hashes (N = 2**14, r = 8: 16 MiB of memory; a check took 130 ms median on a loaded
#: 2-core machine)
SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
SCRYPT_SALT_BYTES = 16
SCRYPT_KEY_BYTES = 32
#: the costs accepted from a users file (bigger ones would let a file make every log-in take seconds or
#: hundreds of MiB)
SCRYPT_MAX_N = 2 ** 16
SCRYPT_MAX_R = 16
SCRYPT_MAX_P = 4
#: memory scrypt may use (it needs 128 * N * r bytes; 128 MiB at the largest accepted costs, with headroom)
SCRYPT_MAX_MEMORY_BYTES = 2 * 128 * SCRYPT_MAX_N * SCRYPT_MAX_R
HASH_SCHEME = "scrypt"

#: a session ends this long after its last request, and at the latest this long after log-in
SESSION_IDLE_S = 30 * 60
SESSION_MAX_S = 12 * 3600
#: sessions kept at once: the oldest are ended beyond it
MAX_SESSIONS = 10_000
#: bytes of randomness in a session id and a CSRF token
TOKEN_BYTES = 32
#: most user names and password lengths taken at the log-in form
MAX_USER_NAME_CHARS = 64
MAX_PASSWORD_CHARS = 1024
#: failed log-ins of one user name within ``LOGIN_FAILURE_WINDOW_S`` before further attempts are refused
#: until the window has passed
MAX_LOGIN_FAILURES = 5
LOGIN_FAILURE_WINDOW_S = 60.0
#: user names whose failures are remembered at once (the oldest are forgotten beyond it)
MAX_THROTTLED_NAMES = 10_000


class Role(enum.Enum):
    ADMIN = "admin"
    READ_ONLY = "read-only"

    @property
    def can_act(self) -> bool:
        return self is Role.ADMIN


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: Role
    password_hash: str


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, *, salt: bytes | None = None, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """The stored form ``scrypt$N$r$p$salt$key`` of ``password`` (a fresh random salt unless given)."""
    salt = secrets.token_bytes(SCRYPT_SALT_BYTES) if salt is None else salt
    key = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=SCRYPT_KEY_BYTES,
                         maxmem=SCRYPT_MAX_MEMORY_BYTES)
    return f"{HASH_SCHEME}${n}${r}${p}${_b64(salt)}${_b64(key)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """(N, r, p, salt, key) of a stored hash; ValueError naming what is wrong."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != HASH_SCHEME:
        raise ValueError(f"not a {HASH_SCHEME}$N$r$p$salt$key hash (write it with `ferry console hash-password`)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        key = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("malformed scrypt hash (N, r, p must be integers, salt and key base64)") from None
    if n < 2 or n & (n - 1) or n > SCRYPT_MAX_N or not 1 <= r <= SCRYPT_MAX_R or not 1 <= p <= SCRYPT_MAX_P:
        raise ValueError(f"scrypt cost out of range (N a power of two up to {SCRYPT_MAX_N}, r up to "
                         f"{SCRYPT_MAX_R}, p up to {SCRYPT_MAX_P})")
    if len(salt) < SCRYPT_SALT_BYTES or len(key) < 16:
        raise ValueError(f"scrypt salt must be at least {SCRYPT_SALT_BYTES} bytes and the key at least 16")
    return n, r, p, salt, key


@functools.cache
def dummy_hash() -> str:
    """A hash no password is known for: checked against when the user name is unknown, so an unknown name
    costs the same time as a wrong password."""
    return hash_password(secrets.token_hex(16))


def verify_password(password: str, encoded: str) -> bool:
    """Does ``password`` match the stored hash? (constant-time comparison of the derived keys)"""
    n, r, p, salt, key = _parse_hash(encoded)
    got = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=len(key),
                         maxmem=SCRYPT_MAX_MEMORY_BYTES)
    return hmac.compare_digest(got, key)


def check_user_name(name: str) -> str:
    if not name or len(name) > MAX_USER_NAME_CHARS or any(c.isspace() or not c.isprintable() for c in name):
        raise ValueError(f"user name must be 1..{MAX_USER_NAME_CHARS} printable characters without spaces")
    return name


def parse_users(obj: Any) -> dict[str, User]:
    """The accounts of a parsed users file; ValueError naming the first bad entry."""
    if not isinstance(obj, dict) or not isinstance(obj.get("users"), dict) or not obj["users"]:
        raise ValueError("a users file holds a non-empty 'users:' mapping of name -> {role, password}")
    users: dict[str, User] = {}
    roles = ", ".join(r.value for r in Role)
    for name, entry in obj["users"].items():
        name = str(name)
        try:
            check_user_name(name)
            if not isinstance(entry, dict):
                raise ValueError("must be a mapping with role and password")
            try:
                role = Role(str(entry.get("role", "")))
            except ValueError:
                raise ValueError(f"role must be one of {roles}") from None
            password = entry.get("password")
            if not isinstance(password, str):
                raise ValueError("password must be a string (a hash from `ferry console hash-password`)")
            _parse_hash(password)
        except ValueError as exc:
            raise ValueError(f"user {name!r}: {exc}") from None
        users[name] = User(name, role, password)
    return users


def load_users(path: str | Path) -> dict[str, User]:
    """The accounts of a users file; ValueError (unreadable, not YAML, a bad entry) with the reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not YAML: {exc}") from None
    try:
        return parse_users(obj)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def users_file_entry(name: str, role: Role, password_hash: str) -> str:
    """One line of a users file's ``users:`` mapping (what ``ferry console hash-password`` prints)."""
    return f"  {name}: {{role: {role.value}, password: \"{password_hash}\"}}"


@dataclass(slots=True)
class Session:
    session_id: str
    user: str
    role: Role
    csrf_token: str
    created_s: float
    last_seen_s: float
    #: one-shot messages shown on the next page: (kind "ok" / "error", text)
    flashes: list[tuple[str, str]] = field(default_factory=list)

    def flash(self, kind: str, text: str) -> None:
        self.flashes.append((kind, text))
        del self.flashes[:-8]

    def take_flashes(self) -> list[tuple[str, str]]:
        out, self.flashes = self.flashes, []
        return out

    def csrf_ok(self, presented: str | None) -> bool:
        """Is ``presented`` this session's CSRF token? (constant time)"""
        return hmac.compare_digest(self.csrf_token.encode(), (presented or "").encode("utf-8", "replace"))


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


class SessionStore:
    """Live sessions by id, in insertion order (the oldest is ended first beyond ``max_sessions``)."""

    def __init__(self, *, idle_s: float = SESSION_IDLE_S, max_age_s: float = SESSION_MAX_S,
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.idle_s, self.max_age_s, self.max_sessions = idle_s, max_age_s, max_sessions
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, user: User, now_s: float) -> Session:
        session = Session(new_token(), user.name, user.role, new_token(), now_s, now_s)
        self._sessions[session.session_id] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None, now_s: float) -> Session | None:
        """The live session of this id (its idle clock restarted), or None (unknown, idle or too old:
        then it is ended)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if now_s - session.last_seen_s > self.idle_s or now_s - session.created_s > self.max_age_s:
            del self._sessions[session_id]
            return None
        session.last_seen_s = now_s
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def end_user(self, user: str) -> None:
        """End every session of ``user`` (an account removed or demoted when the users file is reloaded)."""
        for sid in [sid for sid, s in self._sessions.items() if s.user == user]:
            del self._sessions[sid]


class LoginThrottle:
    """Failed log-ins per user name: at most ``max_failures`` within ``window_s``; beyond, attempts are refused
    (without checking the password) until the oldest failure leaves the window."""

    def __init__(self, *, max_failures: int = MAX_LOGIN_FAILURES, window_s: float = LOGIN_FAILURE_WINDOW_S,
                 max_names: int = MAX_THROTTLED_NAMES) -> None:
        self.max_failures, self.window_s, self.max_names = max_failures, window_s, max_names
        self._failures: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    def _recent(self, name: str, now_s: float) -> list[float]:
        times = [t for t in self._failures.get(name, ()) if now_s - t < self.window_s]
        if times:
            self._failures[name] = times
        else:
            self._failures.pop(name, None)
        return times

    def allowed(self, name: str, now_s: float) -> bool:
        return len(self._recent(name, now_s)) < self.max_failures

    def failed(self, name: str, now_s: float) -> None:
        times = self._recent(name, now_s)
        times.append(now_s)
        self._failures[name] = times
        self._failures.move_to_end(name)
        while len(self._failures) > self.max_names:
            self._failures.popitem(last=False)

    def succeeded(self, name: str) -> None:
        self._failures.pop(name, None)
