"""``plain_acl.yml``: parsed with PyYAML, validated into values; every error names its key.

| key                               | type            | meaning                                            |
|-----------------------------------|-----------------|----------------------------------------------------|
| globalWhiteRemoteAddresses        | list of pattern | addresses served without any signature or perm check |
| accounts[]                        | list of maps    | one per access key                                 |
| accounts[].accessKey              | str, required   | unique, at least 6 characters                      |
| accounts[].secretKey              | str, required   | at least 6 characters                              |
| accounts[].whiteRemoteAddress     | pattern         | this account's addresses skip the signature and perm checks |
| accounts[].admin                  | bool            | may use admin request codes; passes every topic/group check |
| accounts[].defaultTopicPerm       | perm            | topics not in topicPerms (default DENY)            |
| accounts[].defaultGroupPerm       | perm            | groups not in groupPerms (default DENY)            |
| accounts[].topicPerms             | list "t=PERM"   | per-topic perms                                    |
| accounts[].groupPerms             | list "g=PERM"   | per-group perms (also %RETRY%g and %DLQ%g topics)  |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from ferrymq.acl.perm import AddressMatcher, Perm, parse_address_pattern, parse_perm
from ferrymq.errors import ConfigError

#: RocketMQ's lower bound for access and secret keys
MIN_KEY_CHARS = 6
TOP_KEYS = frozenset(("globalWhiteRemoteAddresses", "accounts", "dataVersion"))
ACCOUNT_KEYS = frozenset(("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                          "defaultGroupPerm", "topicPerms", "groupPerms"))


@dataclass(slots=True)
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    white_remote_address: AddressMatcher | None = None
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: dict[str, Perm] = field(default_factory=dict)
    group_perms: dict[str, Perm] = field(default_factory=dict)


@dataclass(slots=True)
class AclConfig:
    global_white: list[AddressMatcher] = field(default_factory=list)
    accounts: dict[str, Account] = field(default_factory=dict)


def parse_acl(text: str, source: str = "plain_acl.yml") -> AclConfig:
    """The ACL of a ``plain_acl.yml`` text; ConfigError naming the first bad key."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(source, f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(source, "expected a map with globalWhiteRemoteAddresses and accounts")
    for key in doc:
        if key not in TOP_KEYS:
            raise ConfigError(str(key), f"unknown key in {source} (expected one of {', '.join(sorted(TOP_KEYS))})")
    cfg = AclConfig()
    cfg.global_white = [_pattern(f"globalWhiteRemoteAddresses[{i}]", p)
                        for i, p in enumerate(_list(doc, "globalWhiteRemoteAddresses"))]
    for i, raw in enumerate(_list(doc, "accounts")):
        account = _account(f"accounts[{i}]", raw)
        if account.access_key in cfg.accounts:
            raise ConfigError(f"accounts[{i}].accessKey", f"{account.access_key!r} appears twice")
        cfg.accounts[account.access_key] = account
    return cfg


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(key, f"expected a list, got {type(value).__name__}")
    return value


def _pattern(key: str, raw: Any) -> AddressMatcher:
    try:
        return parse_address_pattern(raw)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None


def _perm(key: str, raw: Any) -> Perm:
    try:
        return parse_perm(raw)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None


def _key_text(key: str, raw: Any) -> str:
    if not isinstance(raw, (str, int)) or isinstance(raw, bool) or len(str(raw)) < MIN_KEY_CHARS:
        raise ConfigError(key, f"expected a string of at least {MIN_KEY_CHARS} characters")
    return str(raw)


def _account(prefix: str, raw: Any) -> Account:
    if not isinstance(raw, dict):
        raise ConfigError(prefix, "expected a map with accessKey and secretKey")
    for key in raw:
        if key not in ACCOUNT_KEYS:
            raise ConfigError(f"{prefix}.{key}", f"unknown key (expected one of {', '.join(sorted(ACCOUNT_KEYS))})")
    for key in ("accessKey", "secretKey"):
        if key not in raw:
            raise ConfigError(f"{prefix}.{key}", "missing")
    account = Account(_key_text(f"{prefix}.accessKey", raw["accessKey"]),
                      _key_text(f"{prefix}.secretKey", raw["secretKey"]))
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError(f"{prefix}.admin", f"expected true or false, got {admin!r}")
    account.admin = admin
    if raw.get("whiteRemoteAddress") not in (None, ""):
        account.white_remote_address = _pattern(f"{prefix}.whiteRemoteAddress", raw["whiteRemoteAddress"])
    if raw.get("defaultTopicPerm") is not None:
        account.default_topic_perm = _perm(f"{prefix}.defaultTopicPerm", raw["defaultTopicPerm"])
    if raw.get("defaultGroupPerm") is not None:
        account.default_group_perm = _perm(f"{prefix}.defaultGroupPerm", raw["defaultGroupPerm"])
    account.topic_perms = _resource_perms(f"{prefix}.topicPerms", raw.get("topicPerms"))
    account.group_perms = _resource_perms(f"{prefix}.groupPerms", raw.get("groupPerms"))
    return account


def _resource_perms(key: str, raw: Any) -> dict[str, Perm]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ConfigError(key, f"expected a list of name=PERM, got {type(raw).__name__}")
    out: dict[str, Perm] = {}
    for i, item in enumerate(raw):
        name, sep, perm = str(item).partition("=") if isinstance(item, str) else ("", "", "")
        if not sep or not name.strip():
            raise ConfigError(f"{key}[{i}]", f"expected name=PERM, got {item!r}")
        out[name.strip()] = _perm(f"{key}[{i}]", perm)
    return out
