"""``ferry controller`` / ``ferry namesrv -c`` option and config errors (one line, exit 2), and the status table
rows."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ferrymq.cli.controller import command as controller_command
from ferrymq.cli.controller import replica_rows
from ferrymq.cli.namesrv import command as namesrv_command


def test_bad_controller_config_is_one_line_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "controller.conf"
    conf.write_text("controllerPeers=n0-127.0.0.1:1\ncontrollerSelfId=n9\n")
    result = CliRunner().invoke(controller_command, ["-c", str(conf)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "controllerSelfId" in result.output
    missing = CliRunner().invoke(controller_command, ["start", "-c", str(tmp_path / "nope.conf")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_controller_without_config_or_subcommand_is_a_usage_error() -> None:
    result = CliRunner().invoke(controller_command, [])
    assert result.exit_code == 2 and "-c controller.conf" in result.output
    both = CliRunner().invoke(controller_command, ["-c", "x.conf", "status"])
    assert both.exit_code == 2


def test_namesrv_conf_with_a_bad_controller_key(tmp_path: Path) -> None:
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenPort=0\nenableControllerInNamesrv=true\ncontrollerBrokerHeartbeatTimeoutMs=abc\n")
    result = CliRunner().invoke(namesrv_command, ["-c", str(conf)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "controllerBrokerHeartbeatTimeoutMs" in result.output
    conf.write_text("enableControllerInNamesrv=maybe\n")
    result = CliRunner().invoke(namesrv_command, ["-c", str(conf)])
    assert result.exit_code == 2 and "enableControllerInNamesrv" in result.output


def test_replica_rows() -> None:
    group = {"brokerName": "b", "clusterName": "c", "masterId": 2, "masterEpoch": 3, "syncStateSet": [1, 2],
             "syncStateSetEpoch": 4, "replicas": {
                 "10": {"brokerAddr": "h:10", "alive": False, "maxPhyOffset": 5, "lastHeartbeatAgoMs": 9000},
                 "2": {"brokerAddr": "h:2", "alive": True, "maxPhyOffset": 7, "lastHeartbeatAgoMs": 100},
                 "1": {"brokerAddr": "h:1", "alive": True, "maxPhyOffset": 6, "lastHeartbeatAgoMs": 200}}}
    rows = replica_rows([group])
    assert [(r["id"], r["role"], r["alive"]) for r in rows] == [(1, "in-sync", "yes"), (2, "master", "yes"),
                                                                 (10, "replica", "no")]
    assert rows[0]["syncStateSet"] == "1,2" and rows[0]["masterEpoch"] == 3
