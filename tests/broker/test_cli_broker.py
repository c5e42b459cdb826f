"""``ferry broker`` start-up errors and the async fast path."""

from __future__ import annotations

from broker_helpers import make_config, send_v1
from click.testing import CliRunner

from ferrymq.broker.app import BrokerController
from ferrymq.cli.broker import command
from ferrymq.remoting.codec import FrameDecoder, RemotingCommand


def test_invalid_value_exits_2_with_one_line(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\nlistenPort=notaport\n")
    result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2
    assert "listenPort" in result.output and len(result.output.strip().splitlines()) == 1


def test_slave_with_broker_id_zero_exits_2(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerRole=SLAVE\nbrokerId=0\n")
    result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2 and "brokerId" in result.output


def test_missing_file_exits_2(tmp_path) -> None:
    result = CliRunner().invoke(command, ["-c", str(tmp_path / "nope.conf")])
    assert result.exit_code == 2


class _Peer:
    peer_addr = "127.0.0.1:5555"
    closed = False


async def test_async_send_is_answered_inline(tmp_path) -> None:
    async with BrokerController(make_config(str(tmp_path / "s"))) as ctl:
        handler = ctl.dispatcher.get(10)
        assert handler is not None
        resp = handler(_Peer(), RemotingCommand.request(10, send_v1("Fast"), b"x"))
        # the usual SEND_OK answer is an already-encoded frame (Connection writes bytes as they are)
        assert isinstance(resp, bytes)
        frame = FrameDecoder().feed(resp)
        assert len(frame) == 1 and frame[0].code == 0 and frame[0].ext_fields["queueOffset"] == "0"
