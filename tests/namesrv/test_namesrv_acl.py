"""A name server with aclEnable (namesrv.conf): its write operations need a signed admin account; reads and
broker registration stay open; a bad ACL file stops ``ferry namesrv`` with exit 2 naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from namesrv_acl_accounts import ACL, ADMIN, USER

from ferrymq.namesrv.app import NameServer
from ferrymq.remoting import signature
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect


async def test_write_codes_need_an_admin_account(tmp_path: Path) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    server = NameServer(acl_path=str(acl_file))
    await server.start()
    conn = await connect(server.addr)
    try:
        async def call(code: int, keys: tuple[str, str] | None, **fields: object) -> RemotingCommand:
            cmd = RemotingCommand.request(code, fields)
            if keys is not None:
                signature.sign(cmd.ext_fields, cmd.body, *keys)
            return await conn.invoke(cmd)

        put = {"namespace": "ns", "key": "k", "value": "v"}
        unsigned = await call(RequestCode.PUT_KV_CONFIG, None, **put)
        assert unsigned.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (unsigned.remark or "")
        user = await call(RequestCode.PUT_KV_CONFIG, USER, **put)
        assert user.code == ResponseCode.NO_PERMISSION and "admin" in (user.remark or "")
        forged = await call(RequestCode.PUT_KV_CONFIG, (ADMIN[0], "wrong-secret"), **put)
        assert forged.code == ResponseCode.NO_PERMISSION and "signature" in (forged.remark or "")
        assert (await call(RequestCode.PUT_KV_CONFIG, ADMIN, **put)).code == ResponseCode.SUCCESS
        # reads are open
        got = await call(RequestCode.GET_KV_CONFIG, None, namespace="ns", key="k")
        assert (got.code, got.ext_fields.get("value")) == (ResponseCode.SUCCESS, "v")
        for code, fields in ((RequestCode.DELETE_KV_CONFIG, {"namespace": "ns", "key": "k"}),
                             (RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
                             (RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "b"}),
                             (RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "b"})):
            assert (await call(code, USER, **fields)).code == ResponseCode.NO_PERMISSION, code
        assert (await call(RequestCode.DELETE_KV_CONFIG, ADMIN, namespace="ns", key="k")).code == ResponseCode.SUCCESS
        assert (await call(RequestCode.GET_BROKER_CLUSTER_INFO, None)).code == ResponseCode.SUCCESS
    finally:
        conn.close()
        await server.stop()


@pytest.mark.parametrize(("acl_text", "needle"), [("accounts:\n  - accessKey: abcdef\n", "accounts[0].secretKey"),
                                                   ("accounts: [\n", "plain_acl.yml")])
def test_bad_acl_file_stops_the_name_server(tmp_path: Path, acl_text: str, needle: str) -> None:
    (tmp_path / "plain_acl.yml").write_text(acl_text)
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenHost=127.0.0.1\nlistenPort=0\naclEnable=true\n")
    result = subprocess.run([sys.executable, "-m", "ferrymq.cli", "namesrv", "-c", str(conf)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
