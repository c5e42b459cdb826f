"""acl/edit.py: the ACL admin codes' changes to plain_acl.yml, as data and on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferrymq.acl import edit
from ferrymq.acl.config import parse_acl
from ferrymq.acl.perm import Perm
from ferrymq.errors import ConfigError

BASE = """
globalWhiteRemoteAddresses:
  - 10.0.0.*
accounts:
  - accessKey: adminKey1
    secretKey: adminSecret1
    admin: true
"""


def test_create_change_and_delete_an_account(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    doc = edit.upsert_account(edit.load_doc(str(path)), {
        "accessKey": "userKey1", "secretKey": "userSecret1", "topicPerms": "A=PUB, B=SUB", "admin": "false"})
    edit.save_doc(str(path), doc, clock_ms=1234)
    acl = parse_acl(path.read_text())
    assert acl.accounts["userKey1"].topic_perms == {"A": Perm.PUB, "B": Perm.SUB}
    assert edit.data_version(edit.load_doc(str(path))) == {"counter": 1, "timestamp": 1234}
    # only the fields given change
    doc = edit.upsert_account(edit.load_doc(str(path)), {"accessKey": "userKey1", "defaultGroupPerm": "SUB"})
    edit.save_doc(str(path), doc)
    user = parse_acl(path.read_text()).accounts["userKey1"]
    assert user.secret_key == "userSecret1" and user.default_group_perm is Perm.SUB and "A" in user.topic_perms
    assert edit.data_version(edit.load_doc(str(path)))["counter"] == 2
    edit.save_doc(str(path), edit.delete_account(edit.load_doc(str(path)), "userKey1"))
    assert set(parse_acl(path.read_text()).accounts) == {"adminKey1"}
    with pytest.raises(ValueError, match="no account"):
        edit.delete_account(edit.load_doc(str(path)), "userKey1")


def test_an_invalid_change_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(BASE)
    for fields in ({"accessKey": "userKey2", "secretKey": "short"},
                   {"accessKey": "userKey2", "secretKey": "longEnough", "defaultTopicPerm": "WRITE"}):
        with pytest.raises(ConfigError):
            edit.save_doc(str(path), edit.upsert_account(edit.load_doc(str(path)), fields))
    with pytest.raises(ValueError, match="admin"):
        edit.upsert_account({}, {"accessKey": "userKey2", "admin": "maybe"})
    with pytest.raises(ValueError, match="accessKey"):
        edit.upsert_account({}, {"secretKey": "userSecret2"})
    assert path.read_text() == BASE
    assert [p.name for p in tmp_path.iterdir()] == ["plain_acl.yml"]  # no temporary file left


def test_white_addresses_and_wire_form(tmp_path: Path) -> None:
    doc = edit.set_global_white(edit.load_doc(str(tmp_path / "absent.yml")), "192.168.1.*, 10.1.1.1")
    wire = edit.to_wire(edit.upsert_account(doc, {"accessKey": "userKey3", "secretKey": "userSecret3"}))
    assert wire["globalWhiteAddrs"] == ["192.168.1.*", "10.1.1.1"]
    assert wire["plainAccessConfigs"] == [{
        "accessKey": "userKey3", "secretKey": "userSecret3", "whiteRemoteAddress": "", "admin": False,
        "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY", "topicPerms": [], "groupPerms": []}]
    assert edit.set_global_white(doc, "")["globalWhiteRemoteAddresses"] == []
