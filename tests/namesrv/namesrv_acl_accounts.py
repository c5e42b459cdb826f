"""The ACL accounts of the name-server tests with aclEnable: an admin and a plain user (PUB|SUB on every
topic by default)."""

from __future__ import annotations

ADMIN = ("nsAdmin01", "nsAdminSecret")
USER = ("nsUser01", "nsUserSecret")
ACL = f"""
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {USER[0]}
    secretKey: {USER[1]}
    defaultTopicPerm: PUB|SUB
"""
