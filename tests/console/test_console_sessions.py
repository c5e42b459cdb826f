"""The console's log-in pieces without sockets (console/auth.py): scrypt password hashes, the users file, sessions
with their expiry and CSRF token, and the throttle of failed log-ins. The clock is passed in."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from ferrymq.console import auth
from ferrymq.console.auth import LoginThrottle, Role, SessionStore, User

#: a cheap cost for the tests (the default is SCRYPT_N)
CHEAP_N = 2 ** 4


def cheap_hash(password: str, salt: bytes | None = None) -> str:
    return auth.hash_password(password, salt=salt, n=CHEAP_N)


def test_a_hash_checks_its_password_only() -> None:
    encoded = cheap_hash("s3cret pass")
    assert encoded.startswith(f"scrypt${CHEAP_N}$8$1$")
    assert auth.verify_password("s3cret pass", encoded)
    for wrong in ("s3cret pas", "S3cret pass", "", "s3cret pass "):
        assert not auth.verify_password(wrong, encoded)


def test_each_hash_has_its_own_salt() -> None:
    first, second = cheap_hash("same"), cheap_hash("same")
    assert first != second
    assert first.split("$")[4] != second.split("$")[4]
    assert len(base64.b64decode(first.split("$")[4])) == auth.SCRYPT_SALT_BYTES
    assert cheap_hash("same", salt=b"s" * 16) == cheap_hash("same", salt=b"s" * 16)


def test_the_default_cost_is_the_documented_one() -> None:
    encoded = auth.hash_password("pw")
    n, r, p = (int(x) for x in encoded.split("$")[1:4])
    assert (n, r, p) == (auth.SCRYPT_N, auth.SCRYPT_R, auth.SCRYPT_P)
    assert auth.verify_password("pw", encoded)


@pytest.mark.parametrize("encoded", [
    "plaintext", "sha256$abc", "scrypt$16$8$1$c2FsdA==", "scrypt$x$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAA==",
    "scrypt$15$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAA==",  # N not a power of two
    f"scrypt${2 ** 24}$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAA==",  # too costly
    "scrypt$16$8$1$AAAA$AAAAAAAAAAAAAAAAAAAAAA==",  # salt too short
    "scrypt$16$8$1$!!!!$AAAAAAAAAAAAAAAAAAAAAA==",
])
def test_a_hash_that_cannot_be_checked_safely_is_refused(encoded: str) -> None:
    with pytest.raises(ValueError):
        auth.verify_password("pw", encoded)


def test_the_users_file(tmp_path: Path) -> None:
    path = tmp_path / "users.yml"
    admin_hash, viewer_hash = cheap_hash("a-pw"), cheap_hash("v-pw")
    path.write_text("users:\n" + auth.users_file_entry("alice", Role.ADMIN, admin_hash) + "\n"
                    + auth.users_file_entry("bob", Role.READ_ONLY, viewer_hash) + "\n")
    users = auth.load_users(path)
    assert users == {"alice": User("alice", Role.ADMIN, admin_hash), "bob": User("bob", Role.READ_ONLY, viewer_hash)}
    assert users["alice"].role.can_act and not users["bob"].role.can_act


@pytest.mark.parametrize(("text", "needle"), [
    ("", "non-empty 'users:'"),
    ("users: {}\n", "non-empty 'users:'"),
    ("users: [a, b]\n", "non-empty 'users:'"),
    ("users:\n  alice: {role: admin, password: hunter2}\n", "user 'alice'"),
    ("users:\n  alice: {role: root, password: 'scrypt$16$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAA=='}\n",
     "role must be one of"),
    ("users:\n  alice: {role: admin}\n", "password must be a string"),
    ("users:\n  alice: admin\n", "must be a mapping"),
    ("users:\n  'al ice': {role: admin, password: x}\n", "without spaces"),
    ("users: [\n", "not YAML"),
])
def test_a_bad_users_file_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "users.yml"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        auth.load_users(path)


def test_a_missing_users_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        auth.load_users(tmp_path / "nope.yml")


def _user(role: Role = Role.ADMIN, name: str = "alice") -> User:
    return User(name, role, "unused")


def test_sessions_end_when_idle_or_too_old() -> None:
    store = SessionStore(idle_s=100, max_age_s=1000)
    session = store.create(_user(), now_s=0)
    assert store.get(session.session_id, now_s=99) is session
    assert store.get(session.session_id, now_s=198) is session  # each request restarts the idle clock
    assert store.get(session.session_id, now_s=299) is None  # idle 101 s
    assert store.get(session.session_id, now_s=300) is None  # and it stays ended
    old = store.create(_user(), now_s=0)
    for t in range(90, 1000, 90):
        assert store.get(old.session_id, now_s=t) is old
    assert store.get(old.session_id, now_s=1001) is None  # too old, though never idle
    assert store.get(None, 0) is None and store.get("", 0) is None and store.get("forged", 0) is None


def test_session_ids_and_csrf_tokens_are_random_and_distinct() -> None:
    store = SessionStore()
    sessions = [store.create(_user(), 0) for _ in range(50)]
    tokens = {s.session_id for s in sessions} | {s.csrf_token for s in sessions}
    assert len(tokens) == 100
    assert all(len(t) >= 43 for t in tokens)  # 32 bytes, base64url


def test_the_csrf_check() -> None:
    session = SessionStore().create(_user(), 0)
    assert session.csrf_ok(session.csrf_token)
    for wrong in (None, "", session.csrf_token[:-1], session.csrf_token + "x", "é" * 43, session.session_id):
        assert not session.csrf_ok(wrong)


def test_logout_and_the_bound_on_sessions() -> None:
    store = SessionStore(max_sessions=3)
    first, *rest = [store.create(_user(name=f"u{i}"), 0) for i in range(4)]
    assert len(store) == 3 and store.get(first.session_id, 1) is None
    store.end(rest[0].session_id)
    assert store.get(rest[0].session_id, 1) is None and len(store) == 2
    store.end_user("u2")
    assert store.get(rest[1].session_id, 1) is None and store.get(rest[2].session_id, 1) is rest[2]


def test_flashes_are_shown_once() -> None:
    session = SessionStore().create(_user(), 0)
    session.flash("ok", "done")
    session.flash("error", "refused: x")
    assert session.take_flashes() == [("ok", "done"), ("error", "refused: x")]
    assert session.take_flashes() == []


def test_failed_logins_are_throttled_per_user_name() -> None:
    throttle = LoginThrottle(max_failures=3, window_s=60)
    for t in (0, 1, 2):
        assert throttle.allowed("alice", t)
        throttle.failed("alice", t)
    assert not throttle.allowed("alice", 3)
    assert throttle.allowed("bob", 3)  # another name is not affected
    assert not throttle.allowed("alice", 59.5)
    assert throttle.allowed("alice", 60.5)  # the first failure left the window
    throttle.failed("alice", 61)
    throttle.succeeded("alice")
    assert throttle.allowed("alice", 62)


def test_the_throttle_remembers_a_bounded_number_of_names() -> None:
    throttle = LoginThrottle(max_failures=1, window_s=60, max_names=2)
    for name in ("a", "b", "c"):
        throttle.failed(name, 0)
    assert throttle.allowed("a", 1)  # forgotten, the oldest
    assert not throttle.allowed("c", 1)
