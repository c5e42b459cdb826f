"""Changes to a ``plain_acl.yml`` made by the ACL admin codes (50..54): the YAML document is edited as data,
checked with ``parse_acl`` before it is written (a change that would make the file invalid is refused and the
file is left alone), written atomically, and its ``dataVersion`` counter is raised.

| ACL admin code                        | header fields                                  | effect                      |
|---------------------------------------|------------------------------------------------|-----------------------------|
| UPDATE_AND_CREATE_ACL_CONFIG 50       | accessKey, secretKey, whiteRemoteAddress, admin, defaultTopicPerm, defaultGroupPerm, topicPerms / groupPerms (``a=PUB,b=SUB``) | create the account, or change the fields given |
| DELETE_ACL_CONFIG 51                  | accessKey                                      | remove the account          |
| GET_BROKER_CLUSTER_ACL_INFO 52        | (answer) version, brokerName, brokerAddr, clusterName | the file's version    |
| UPDATE_GLOBAL_WHITE_ADDRS_CONFIG 53   | globalWhiteAddrs (``a,b``; empty clears)       | replace the global whitelist |
| GET_BROKER_CLUSTER_ACL_CONFIG 54      | (answer body) JSON globalWhiteAddrs, plainAccessConfigs | the whole ACL        |

``dataVersion`` is written as RocketMQ writes it: a list of one map with ``counter`` and ``timestamp``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import yaml

from ferrymq.acl.config import ACCOUNT_KEYS, parse_acl
from ferrymq.errors import ConfigError

#: header fields of code 50 that are lists in the file (comma-separated on the wire)
LIST_FIELDS = ("topicPerms", "groupPerms")


def load_doc(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh.read())
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(os.path.basename(path), f"cannot read: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(os.path.basename(path), "expected a map with globalWhiteRemoteAddresses and accounts")
    return doc


def data_version(doc: Mapping[str, Any]) -> dict[str, int]:
    versions = doc.get("dataVersion")
    if isinstance(versions, list) and versions and isinstance(versions[0], dict):
        first = versions[0]
        return {"counter": int(first.get("counter", 0) or 0), "timestamp": int(first.get("timestamp", 0) or 0)}
    return {"counter": 0, "timestamp": 0}


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def upsert_account(doc: dict[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """``doc`` with the account of ``fields["accessKey"]`` created or changed (ValueError for bad fields)."""
    access_key = (fields.get("accessKey") or "").strip()
    if not access_key:
        raise ValueError("accessKey is required")
    accounts = [dict(a) for a in doc.get("accounts") or [] if isinstance(a, dict)]
    account = next((a for a in accounts if str(a.get("accessKey")) == access_key), None)
    if account is None:
        account = {"accessKey": access_key}
        accounts.append(account)
    for key in ACCOUNT_KEYS - {"accessKey"}:
        raw = fields.get(key)
        if raw is None:
            continue
        if key in LIST_FIELDS:
            account[key] = _split(raw)
        elif key == "admin":
            if raw.strip().lower() not in ("true", "false"):
                raise ValueError(f"admin: expected true or false, got {raw!r}")
            account[key] = raw.strip().lower() == "true"
        else:
            account[key] = raw.strip()
    return dict(doc, accounts=accounts)


def delete_account(doc: dict[str, Any], access_key: str) -> dict[str, Any]:
    accounts = [a for a in doc.get("accounts") or [] if isinstance(a, dict)]
    kept = [a for a in accounts if str(a.get("accessKey")) != access_key]
    if len(kept) == len(accounts):
        raise ValueError(f"no account with accessKey {access_key!r}")
    return dict(doc, accounts=kept)


def set_global_white(doc: dict[str, Any], addresses: str) -> dict[str, Any]:
    return dict(doc, globalWhiteRemoteAddresses=_split(addresses))


def save_doc(path: str, doc: dict[str, Any], clock_ms: int | None = None) -> dict[str, Any]:
    """Check ``doc`` (ConfigError naming the bad key), raise its version and write it atomically."""
    version = data_version(doc)
    doc = dict(doc, dataVersion=[{"counter": version["counter"] + 1,
                                  "timestamp": int(time.time() * 1000) if clock_ms is None else clock_ms}])
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    parse_acl(text, os.path.basename(path))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".plain_acl.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return doc


def to_wire(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The body of GET_BROKER_CLUSTER_ACL_CONFIG (54)."""
    configs = []
    for account in doc.get("accounts") or []:
        if not isinstance(account, dict):
            continue
        configs.append({"accessKey": str(account.get("accessKey", "")), "secretKey": str(account.get("secretKey", "")),
                        "whiteRemoteAddress": account.get("whiteRemoteAddress") or "",
                        "admin": bool(account.get("admin", False)),
                        "defaultTopicPerm": account.get("defaultTopicPerm") or "DENY",
                        "defaultGroupPerm": account.get("defaultGroupPerm") or "DENY",
                        "topicPerms": list(account.get("topicPerms") or []),
                        "groupPerms": list(account.get("groupPerms") or [])})
    return {"globalWhiteAddrs": list(doc.get("globalWhiteRemoteAddresses") or []), "plainAccessConfigs": configs}
