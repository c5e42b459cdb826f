"""Run every examples/ script and the CLI verbs as subprocesses against a live in-process broker."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from support.inproc import needs_cluster

pytestmark = needs_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TIMEOUT_S = 60


async def run(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), EXAMPLE_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"{args} timed out; stdout={out.decode()[-1000:]} stderr={err.decode()[-3000:]}") from None
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


async def test_examples(ns_addr: str) -> None:
    code, out, err = await run("examples/admin.py", ns_addr, "ExT")
    assert code == 0, err
    assert "created on" in out
    code, out, err = await run("examples/producer.py", ns_addr, "ExT")
    assert code == 0, err
    assert out.count("ordered") == 3
    code, out, err = await run("examples/push_consumer.py", ns_addr, "ExT", "7", "30")
    assert code == 0, err
    assert "received 7" in out
    code, out, err = await run("examples/pull_consumer.py", ns_addr, "ExT")
    assert code == 0, err
    assert "pulled 7" in out


def ferry(*args: str) -> list[str]:
    return ["-m", "ferrymq.cli", *args]


async def test_cli_verbs(ns_addr: str) -> None:
    n = ["-n", ns_addr]
    code, out, err = await run(*ferry("topic", "create", *n, "-t", "CliT", "-r", "2", "-w", "2", "--json"))
    assert code == 0, err
    assert json.loads(out)[0]["topic"] == "CliT"
    code, out, err = await run(*ferry("produce", *n, "-t", "CliT", "--tags", "TagA", "--keys", "ck1 ck2",
                                      "--count", "3", "--json", "hello"))
    assert code == 0, err
    sent = json.loads(out)
    assert len(sent) == 3 and sent[0]["status"] == "SEND_OK"
    code, out, err = await run(*ferry("produce", *n, "-t", "CliT"), stdin=b"line1\nline2\n")
    assert code == 0, err
    assert "SEND_OK" in out
    code, out, err = await run(*ferry("consume", *n, "-t", "CliT", "-g", "cli-cg", "--count", "5",
                                      "--from-beginning", "--timeout-s", "30", "--json"))
    assert code == 0, err
    assert len(out.strip().splitlines()) == 5
    code, out, err = await run(*ferry("topic", "list", *n, "--json"))
    assert "CliT" in [r["topic"] for r in json.loads(out)]
    code, out, err = await run(*ferry("topic", "route", *n, "-t", "CliT"))
    assert code == 0 and "broker-a" in out
    code, out, err = await run(*ferry("topic", "status", *n, "-t", "CliT", "--json"))
    assert sum(r["maxOffset"] for r in json.loads(out)) == 5
    code, out, err = await run(*ferry("cluster", "list", *n, "--json"))
    assert json.loads(out)[0]["brokerName"] == "broker-a"
    code, out, err = await run(*ferry("consumer", "progress", *n, "-g", "cli-cg", "-t", "CliT", "--json"))
    assert code == 0, err
    assert {"lag", "brokerOffset", "consumerOffset"} <= set(json.loads(out)[0])
    code, out, err = await run(*ferry("message", "show", *n, "--id", sent[0]["offsetMsgId"], "--json"))
    assert json.loads(out)[0]["body"] == "hello"
    code, out, err = await run(*ferry("message", "show", *n, "--key", "ck2", "-t", "CliT", "--json"))
    assert len(json.loads(out)) == 3
    code, out, err = await run(*ferry("topic", "route", *n, "-t", "NoSuchTopicX"))
    assert code != 0 and len(err.strip().splitlines()) == 1 and "TopicNotExist" in err


async def test_transaction_example(ns_addr: str) -> None:
    code, out, err = await run("examples/transaction_producer.py", ns_addr)
    assert code == 0, err
    assert "order-0: half SEND_OK, local COMMIT_MESSAGE" in out
    assert "order-1: half SEND_OK, local ROLLBACK_MESSAGE" in out
