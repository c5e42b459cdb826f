"""GET_BROKER_RUNTIME_INFO read the way rocketmq-exporter (Java, not runnable here) reads it: every key its
BrokerRuntimeStats parses must be present and parse as the type it expects (a missing key or a bad number stops
its whole broker scrape)."""

from __future__ import annotations

import re

from broker_helpers import Client, send_v1

from ferrymq.remoting import jsonx
from ferrymq.remoting.codes import RequestCode as C
from ferrymq.remoting.codes import ResponseCode as R

#: keys the exporter reads with Long.parseLong / Integer.parseInt
LONG_KEYS = ("msgPutTotalTodayNow", "sendThreadPoolQueueHeadWaitTimeMills", "queryThreadPoolQueueHeadWaitTimeMills",
             "msgGetTotalTodayNow", "queryThreadPoolQueueSize", "bootTimestamp", "msgPutTotalYesterdayMorning",
             "msgGetTotalYesterdayMorning", "pullThreadPoolQueueSize", "commitLogMinOffset",
             "pullThreadPoolQueueHeadWaitTimeMills", "dispatchMaxBuffer", "brokerVersion", "pageCacheLockTimeMills",
             "commitLogMaxOffset", "getMessageEntireTimeMax", "msgPutTotalTodayMorning", "putMessageTimesTotal",
             "msgGetTotalTodayMorning", "sendThreadPoolQueueSize", "startAcceptSendRequestTimeStamp",
             "putMessageEntireTimeMax", "earliestMessageTimeStamp", "remainTransientStoreBufferNumbs",
             "queryThreadPoolQueueCapacity", "dispatchBehindBytes", "putMessageSizeTotal",
             "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity")
#: keys read with Double.parseDouble
DOUBLE_KEYS = ("consumeQueueDiskRatio", "commitLogDiskRatio", "putMessageAverageSize")
#: "<10 s> <1 min> <10 min>" rates
TPS_KEYS = ("putTps", "getMissTps", "getTransferedTps", "getTotalTps", "getFoundTps")
#: plain strings
STRING_KEYS = ("runtime", "brokerVersionDesc")


async def test_runtime_info_parses_as_the_exporter_expects(broker, client: Client) -> None:
    for _ in range(3):
        assert (await client.call(C.SEND_MESSAGE, send_v1("ExporterT", 0), b"x" * 100)).code == R.SUCCESS
    resp = await client.call(C.GET_BROKER_RUNTIME_INFO)
    assert resp.code == R.SUCCESS
    table: dict[str, str] = jsonx.loads(resp.body)["table"]
    missing = [k for k in (*LONG_KEYS, *DOUBLE_KEYS, *TPS_KEYS, *STRING_KEYS, "remainHowManyDataToFlush",
                           "commitLogDirCapacity", "putMessageDistributeTime") if k not in table]
    assert not missing, f"keys rocketmq-exporter needs: {missing}"
    for key in LONG_KEYS:
        int(table[key])  # a ValueError names the key in the traceback
    for key in DOUBLE_KEYS:
        float(table[key])
    for key in TPS_KEYS:
        parts = table[key].split(" ")
        assert 1 <= len(parts) <= 3 and all(float(p) >= 0 for p in parts), (key, table[key])
    # "<number> <unit>": the exporter multiplies by 1024 ** ("KMGTPE".indexOf(unit[0]) + 1)
    number, unit = table["remainHowManyDataToFlush"].split(" ")
    assert float(number) >= 0 and unit
    # "Total : <n> <unit>, Free : <n> <unit>." : fields 2, 3, 6, 7 of a split on blanks, units end with , and .
    cap = table["commitLogDirCapacity"].split(" ")
    assert len(cap) == 8 and cap[3].endswith(",") and cap[7].endswith("."), table["commitLogDirCapacity"]
    assert float(cap[2]) > 0 and float(cap[6]) >= 0 and cap[3][:-1][-1:] == "B" and cap[7][:-1][-1:] == "B"
    # "[<=0ms]:n [0~10ms]:n ...": key:value pairs, integer values
    for item in table["putMessageDistributeTime"].split(" "):
        key, value = item.split(":")
        assert key.startswith("[") and key.endswith("]") and int(value) >= 0, item
    for key, value in table.items():
        if key.startswith("scheduleMessageOffset"):
            delay, top = value.split(",")
            int(delay), int(top)
    assert int(table["msgPutTotalTodayNow"]) == 3 and int(table["putMessageTimesTotal"]) >= 3
    assert re.fullmatch(r"\S.*", table["runtime"])
