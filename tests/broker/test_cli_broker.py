"""``ferry broker`` start-up errors and the async fast path."""

from __future__ import annotations

import fcntl
import inspect

import pytest
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
        first = handler(_Peer(), RemotingCommand.request(10, send_v1("Fast"), b"x"))
        # the first send to a new queue waits for its consume queue file, made on a thread (queue_files.py)
        assert inspect.isawaitable(first)
        first = await first
        assert isinstance(first, bytes) and FrameDecoder().feed(first)[0].ext_fields["queueOffset"] == "0"
        resp = handler(_Peer(), RemotingCommand.request(10, send_v1("Fast"), b"x"))
        # the usual SEND_OK answer is an already-encoded frame (Connection writes bytes as they are)
        assert isinstance(resp, bytes)
        frame = FrameDecoder().feed(resp)
        assert len(frame) == 1 and frame[0].code == 0 and frame[0].ext_fields["queueOffset"] == "1"


BAD_CONFIG_LINES = [
    ("mappedFileSizeConsumeQueue=0", "mappedFileSizeConsumeQueue"),
    ("flushIntervalCommitLog=0", "flushIntervalCommitLog"),
    ("syncFlushTimeout=-1", "syncFlushTimeout"),
    ("haListenPort=99999", "haListenPort"),
    ("listenPort=65535", "listenPort"),
    ("brokerIP1=not-an-ip", "brokerIP1"),
    ("mappedFileSizeCommitLog=100", "mappedFileSizeCommitLog"),
    ("haSendHeartbeatInterval=0", "haSendHeartbeatInterval"),
    ("haTransferBatchSize=0", "haTransferBatchSize"),
    ("haTransferBatchSize=-5", "haTransferBatchSize"),
    ("maxReconsumeTimes=-1", "maxReconsumeTimes"),
]


@pytest.mark.parametrize("line, key", BAD_CONFIG_LINES)
def test_wrong_value_is_a_config_error(tmp_path, line: str, key: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=b\nstorePathRootDir={tmp_path / 'store'}\n{line}\n")
    result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: {key}:"), result.output
    assert not (tmp_path / "store").exists()


def test_non_utf8_file_is_a_config_error(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_bytes(b"brokerName=b\xff\xfe\n")
    result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2 and result.output.startswith("config error: -c:") and "UTF-8" in result.output


def test_file_without_broker_keys_is_refused(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerNmae=typo\nstorPathRootDir=/tmp/x\n")
    result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2 and "not a broker config" in result.output


def test_bad_log_level_is_a_config_error(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=b\nstorePathRootDir={tmp_path / 'store'}\n")
    result = CliRunner().invoke(command, ["-c", str(conf), "--log-level", "LOUD"])
    assert result.exit_code == 2 and result.output.startswith("config error: --log-level:")


def test_locked_store_is_a_config_error(tmp_path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=b\nstorePathRootDir={store}\nlistenPort=0\nnamesrvAddr=127.0.0.1:1\n")
    with open(store / "lock", "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running broker holds it
        result = CliRunner().invoke(command, ["-c", str(conf)])
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("config error")]
    assert len(errors) == 1 and errors[0].startswith("config error: storePathRootDir:") and "locked" in errors[0]
    assert "Traceback" not in result.output
