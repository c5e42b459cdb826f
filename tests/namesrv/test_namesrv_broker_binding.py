"""A broker's registration belongs to the connection it registered on (issue 25 item 5): an UNREGISTER_BROKER
from any other connection is refused unless, with aclEnable, an admin account signs it; with aclEnable an
unsigned registration from another host cannot take a live address over; GET_NAMESRV_CONFIG hides file paths
from non-admins and never sends a secret. Raw frames against an in-process name server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from namesrv_acl_accounts import ACL, ADMIN, USER
from namesrv_requests import BROKER, register_cmd

from ferrymq.common.properties import parse_properties
from ferrymq.namesrv.app import NameServer
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import Connection, connect


def unregister_cmd(keys: tuple[str, str] | None = None) -> RemotingCommand:
    cmd = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, BROKER)
    if keys is not None:
        signature.sign(cmd.ext_fields, cmd.body, *keys)
    return cmd


async def route_code(conn: Connection, topic: str = "TopicA") -> int:
    resp = await conn.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    return resp.code


@pytest.fixture(params=[True, False], ids=["acl", "no-acl"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NameServer]:
    acl_path = None
    if request.param:
        acl_file = tmp_path / "plain_acl.yml"
        acl_file.write_text(ACL)
        acl_path = str(acl_file)
    ns = NameServer(acl_path=acl_path, file_props={"aclEnable": str(request.param).lower(),
                                                   "aclFile": acl_path or "", "someSecretKey": "hunter2"})
    await ns.start()
    yield ns
    await ns.stop()


async def test_unregister_only_over_the_registering_connection(server: NameServer) -> None:
    broker = await connect(server.addr)
    other = await connect(server.addr)
    try:
        assert (await broker.invoke(register_cmd())).code == ResponseCode.SUCCESS
        assert await route_code(other) == ResponseCode.SUCCESS

        refused = await other.invoke(unregister_cmd())
        assert refused.code == ResponseCode.NO_PERMISSION, refused.remark
        assert await route_code(other) == ResponseCode.SUCCESS  # the live broker keeps its routes
        if server.acl_guard is not None:
            user = await other.invoke(unregister_cmd(USER))
            assert user.code == ResponseCode.NO_PERMISSION  # a signed non-admin account is not enough
            forged = await other.invoke(unregister_cmd((ADMIN[0], "wrong")))
            assert forged.code == ResponseCode.NO_PERMISSION
            assert await route_code(other) == ResponseCode.SUCCESS

        assert (await broker.invoke(unregister_cmd())).code == ResponseCode.SUCCESS
        assert await route_code(other) == ResponseCode.TOPIC_NOT_EXIST
    finally:
        broker.close()
        other.close()


async def test_admin_may_unregister_from_elsewhere(server: NameServer) -> None:
    if server.acl_guard is None:
        pytest.skip("admin accounts exist only with aclEnable")
    broker = await connect(server.addr)
    admin = await connect(server.addr)
    try:
        assert (await broker.invoke(register_cmd())).code == ResponseCode.SUCCESS
        assert (await admin.invoke(unregister_cmd(ADMIN))).code == ResponseCode.SUCCESS
        assert await route_code(admin) == ResponseCode.TOPIC_NOT_EXIST
    finally:
        broker.close()
        admin.close()


async def _connect_from(ns_addr: str, local_ip: str) -> Connection:
    host, port = ns_addr.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: Connection(), host, int(port), local_addr=(local_ip, 0))
    return conn


async def test_live_address_not_taken_over_from_another_host(server: NameServer) -> None:
    broker = await connect(server.addr)
    try:
        intruder = await _connect_from(server.addr, "127.0.0.2")
    except OSError as exc:
        broker.close()
        pytest.skip(f"cannot bind 127.0.0.2 on this host: {exc}")
    try:
        assert (await broker.invoke(register_cmd("TopicA"))).code == ResponseCode.SUCCESS
        moved = RemotingCommand.request(RequestCode.REGISTER_BROKER, {
            **BROKER, "brokerName": "rogue", "haServerAddr": "", "compressed": False}, b"")
        answer = await intruder.invoke(moved)
        if server.acl_guard is None:
            assert answer.code == ResponseCode.SUCCESS  # without ACL registration is open, as in RocketMQ
            return
        assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
        assert await route_code(broker) == ResponseCode.SUCCESS
        # the same host re-registering over a new connection (a broker reconnecting) is never refused
        again = await connect(server.addr)
        try:
            assert (await again.invoke(register_cmd("TopicA"))).code == ResponseCode.SUCCESS
        finally:
            again.close()
        signature.sign(moved.ext_fields, moved.body, *ADMIN)
        assert (await intruder.invoke(moved)).code == ResponseCode.SUCCESS
    finally:
        broker.close()
        intruder.close()


async def test_namesrv_config_hides_paths_and_secrets(server: NameServer) -> None:
    conn = await connect(server.addr)
    try:
        async def shown(keys: tuple[str, str] | None) -> dict[str, str]:
            cmd = RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG, {})
            if keys is not None:
                signature.sign(cmd.ext_fields, cmd.body, *keys)
            resp = await conn.invoke(cmd)
            assert resp.code == ResponseCode.SUCCESS
            return parse_properties(resp.body.decode())

        unsigned = await shown(None)
        assert unsigned["someSecretKey"] == "******"
        assert "hunter2" not in repr(unsigned)
        if server.acl_guard is None:
            assert "aclFile" in unsigned and "kvConfigPath" in unsigned
            return
        assert "aclFile" not in unsigned and "kvConfigPath" not in unsigned
        assert "listenPort" in unsigned
        assert "aclFile" not in await shown(USER)
        admin = await shown(ADMIN)
        assert admin["aclFile"] == server.acl_guard.path and admin["someSecretKey"] == "******"
    finally:
        conn.close()
