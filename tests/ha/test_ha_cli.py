"""``ferry ha status`` report building (pure) and the click wiring."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ferrymq.cli.ha import build_report, command, render_text


def test_build_report_joins_namesrv_and_runtime_info() -> None:
    info = {
        "brokerAddrTable": {
            "broker-a": {"cluster": "C", "brokerAddrs": {0: "h:1", 1: "h:2"}},
            "broker-b": {"cluster": "C", "brokerAddrs": {1: "h:5"}},
        },
        "clusterAddrTable": {"C": ["broker-a", "broker-b"]},
    }
    links = [{"addr": "h:40000", "ackOffset": 900, "lagBytes": 100, "connectedSinceMs": 1}]
    runtime = {
        "h:1": {
            "commitLogMaxOffset": "1000",
            "brokerRole": "SYNC_MASTER",
            "haSlaveCount": "1",
            "haSlaves": json.dumps(links),
        },
        "h:2": {"commitLogMaxOffset": "900", "masterAddr": "h:1"},
        "h:5": "ConnectError: refused",
    }
    groups = build_report(info, runtime)
    a, b = groups
    assert a["master"]["maxOffset"] == 1000 and a["master"]["haSlaveCount"] == 1
    assert a["slaves"] == [
        {
            "brokerId": 1,
            "addr": "h:2",
            "maxOffset": 900,
            "masterAddr": "h:1",
            "masterHaAddr": "",
            "lagBytes": 100,
        }
    ]
    assert a["haLinks"] == links
    assert b["master"] is None and b["slaves"][0]["error"].startswith("ConnectError")
    text = render_text(groups)
    assert "lag=100 bytes" in text and "(none registered)" in text and "ack=900" in text


def test_cli_unreachable_namesrv_exits_1() -> None:
    result = CliRunner().invoke(command, ["status", "-n", "127.0.0.1:1", "--timeout-ms", "500"])
    assert result.exit_code == 1
