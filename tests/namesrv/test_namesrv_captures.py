"""Replay the name-server frames real clients sent (tests/fixtures/captures) byte for byte."""

from __future__ import annotations

import asyncio
import json
import struct

import orjson
import pytest

from ferrymq.namesrv import NameServer
from ferrymq.namesrv.register_body import body_crc32
from ferrymq.remoting.codec import FrameDecoder, RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.connection import connect
from support.shared import CAPTURES  # noqa: E402

FILES = ["capture_cpp.jsonl", "capture_alions.jsonl", "capture_cpp_slave_only.jsonl"]
READ_TIMEOUT_S = 5.0


def ns_frames(name: str) -> list[tuple[bytes, bytes]]:
    out = []
    for line in (CAPTURES / name).read_text().splitlines():
        obj = json.loads(line)
        if obj.get("role") == "ns" and obj.get("kind") == "frame":
            out.append((obj["header_raw"].encode(), bytes.fromhex(obj.get("body_hex") or "")))
    return out


@pytest.mark.parametrize("name", FILES)
async def test_replay_client_route_requests(name: str) -> None:
    frames = ns_frames(name)
    assert frames
    async with NameServer() as server:
        broker = await connect(server.addr)
        body = orjson.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
            "dataVersion": {"counter": 1, "timestamp": 1},
            "topicConfigTable": {t: {"topicName": t, "perm": 6, "readQueueNums": 4, "writeQueueNums": 4}
                                 for t in ("TopicTest", "TBW102", "%RETRY%cg1")}}})
        reg = RemotingCommand.request(RequestCode.REGISTER_BROKER, {
            "brokerName": "broker-a", "brokerAddr": "127.0.0.1:10911", "clusterName": "DefaultCluster",
            "haServerAddr": "127.0.0.1:10912", "brokerId": 0, "bodyCrc32": body_crc32(body)}, body)
        assert (await broker.invoke(reg)).code == 0
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for header, fbody in frames:
                writer.write(struct.pack(">ii", 4 + len(header) + len(fbody), len(header)) + header + fbody)
            await writer.drain()
            decoder = FrameDecoder()
            answers: list[RemotingCommand] = []
            while len(answers) < len(frames):
                answers += decoder.feed(await asyncio.wait_for(reader.read(65536), READ_TIMEOUT_S))
            for (header, _), answer in zip(frames, answers, strict=True):
                req = json.loads(header)
                assert answer.opaque == req["opaque"] and answer.is_response
                topic = req["extFields"]["topic"]
                if topic in ("TopicTest", "TBW102", "%RETRY%cg1"):
                    assert answer.code == 0, answer.remark
                    assert json.loads(answer.body)["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
                else:
                    assert answer.code == 17
        finally:
            writer.close()
            broker.close()
