"""GET/UPDATE_NAMESRV_CONFIG (319/318) on an in-process name server started from a namesrv.conf: every key
shown, runtime-safe keys applied and written back, other keys refused naming them, all or nothing."""

from __future__ import annotations

from pathlib import Path

from ferrymq.common.properties import parse_properties, read_properties
from ferrymq.namesrv.app import NameServer
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.connection import connect


async def test_runtime_config(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.conf"
    conf.write_text("# the name server\nlistenHost=127.0.0.1\nlistenPort=0\nscanNotActiveBrokerInterval=5000\n")
    props = read_properties(str(conf))
    server = NameServer(scan_interval_ms=5000, config_path=str(conf), file_props=props)
    await server.start()
    conn = await connect(server.addr)
    try:
        async def call(code: int, body: bytes = b"") -> RemotingCommand:
            return await conn.invoke(RemotingCommand.request(code, {}, body))

        shown = parse_properties((await call(RequestCode.GET_NAMESRV_CONFIG)).body.decode())
        assert shown["scanNotActiveBrokerInterval"] == "5000" and shown["listenPort"] == str(server.port)
        assert shown["brokerChannelExpiredTime"] == str(server.routes.broker_expired_ms)

        ok = await call(RequestCode.UPDATE_NAMESRV_CONFIG, b"scanNotActiveBrokerInterval=2000\n"
                                                           b"brokerChannelExpiredTime=60000\n")
        assert (ok.code, ok.ext_fields["persisted"]) == (ResponseCode.SUCCESS, str(conf))
        assert server.scan_interval_ms == 2000 and server.routes.broker_expired_ms == 60000
        text = conf.read_text()
        assert text.startswith("# the name server\n") and "scanNotActiveBrokerInterval=2000" in text
        assert "brokerChannelExpiredTime=60000" in text

        for body, needle in ((b"listenPort=1\nscanNotActiveBrokerInterval=3000\n", "listenPort needs a restart"),
                             (b"noSuchKey=1\n", "noSuchKey is not a name server key"),
                             (b"scanNotActiveBrokerInterval=5\n", "scanNotActiveBrokerInterval"),
                             (b"scanNotActiveBrokerInterval=soon\n", "scanNotActiveBrokerInterval"),
                             (b"", "no key=value line")):
            refused = await call(RequestCode.UPDATE_NAMESRV_CONFIG, body)
            assert refused.code == ResponseCode.SYSTEM_ERROR and needle in (refused.remark or ""), refused.remark
        assert server.scan_interval_ms == 2000  # all or nothing
    finally:
        conn.close()
        await server.stop()
