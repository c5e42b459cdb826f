"""Drives the real RocketMQ 5.x Python SDK (PyPI ``rocketmq-python-client``) for the gRPC tests.

Run as ``python sdk5_driver.py '<json args>'`` with PYTHONPATH naming the SDK's own install directory
(its import name ``rocketmq`` is also the 4.x C++ client's). Every event is one JSON line appended to
``args["out"]``; the last line is ``{"done": ...}`` with a summary.

Every verb takes ``ak``/``sk`` (credentials, default none) and ``tls`` (the SDK's tls_enable; the SDK trusts
the CAs of GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).

Verbs (``args["verb"]``):

* ``produce``: ``count`` messages to ``topic``, bodies ``<prefix>-<seq>``; optional ``groups`` (message
  groups cycled: FIFO), ``tag``, ``keys``, ``delay_s`` (delivery timestamp = now + delay_s), ``props``,
  ``interval_s`` (pause between two sends: traffic spread over a fault).
* ``simple``: a SimpleConsumer of ``group`` on ``topic`` receiving batches of ``batch`` with invisible
  duration ``invisible_s`` until ``expect`` messages were acked (``ack_every``: ack only every n-th
  receive of a message; 0 = never; ``ack_bodies``: ack exactly these bodies), ``receives_expected``
  messages were received, or ``timeout_s`` passes.
* ``push``: a PushConsumer of ``group`` on ``topic`` until ``expect`` messages were consumed; ``consume_s``:
  each callback takes this long (a record is emitted when it starts, ``{"consumed": body}`` when it ends).
* ``transact``: a transactional producer sending one half message per entry of ``decisions``
  (``commit``, ``rollback`` or ``none``: left to the check-back), bodies ``<prefix>-<i>``; its checker
  answers ``check_answer`` (COMMIT or ROLLBACK) and emits ``{"checked": body}``; it runs until
  ``expect_checks`` check-backs came (or ``timeout_s``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def emit(out: str, record: dict[str, Any]) -> None:
    with open(out, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def message_record(m: Any) -> dict[str, Any]:
    return {"body": m.body.decode(), "message_id": m.message_id, "attempt": m.delivery_attempt,
            "group": m.message_group, "tag": m.tag, "keys": sorted(m.keys or []),
            "props": dict(m.properties or {}), "topic": m.topic, "t": time.time()}


def client_config(a: dict[str, Any]) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(a["endpoints"], Credentials(a.get("ak", ""), a.get("sk", "")),
                               request_timeout=a.get("rpc_s", 10))


def produce(a: dict[str, Any]) -> dict[str, Any]:
    from rocketmq import Message, Producer

    producer = Producer(client_config(a), (a["topic"],), tls_enable=a.get("tls", False))
    producer.startup()
    ok = 0
    try:
        for seq in range(a["count"]):
            msg = Message()
            msg.topic = a["topic"]
            msg.body = f"{a['prefix']}-{seq}".encode()
            if a.get("tag"):
                msg.tag = a["tag"]
            if a.get("keys"):
                msg.keys = f"k{seq}"
            groups = a.get("groups")
            if groups:
                msg.message_group = groups[seq % len(groups)]
            if a.get("delay_s"):
                msg.delivery_timestamp = int(time.time() + a["delay_s"])
            for k, v in (a.get("props") or {}).items():
                msg.add_property(k, v)
            try:
                receipt = producer.send(msg)
                emit(a["out"], {"seq": seq, "ok": True, "message_id": receipt.message_id, "t": time.time()})
                ok += 1
            except Exception as exc:
                emit(a["out"], {"seq": seq, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            if a.get("interval_s"):
                time.sleep(a["interval_s"])
    finally:
        producer.shutdown()
    return {"sent": ok}


def simple(a: dict[str, Any]) -> dict[str, Any]:
    from rocketmq import FilterExpression, SimpleConsumer

    expr = FilterExpression(a.get("expression", "*"))
    consumer = SimpleConsumer(client_config(a), a["group"], {a["topic"]: expr}, await_duration=a.get("await_s", 2),
                              tls_enable=a.get("tls", False))
    consumer.startup()
    acked = received = 0
    ack_every = a.get("ack_every", 1)
    seen: dict[str, int] = {}
    deadline = time.time() + a["timeout_s"]
    try:
        while acked < a["expect"] and time.time() < deadline:
            if a.get("receives_expected") and received >= a["receives_expected"]:
                break
            try:
                messages = consumer.receive(a.get("batch", 16), a.get("invisible_s", 15))
            except Exception as exc:
                emit(a["out"], {"error": f"{type(exc).__name__}: {exc}", "t": time.time()})
                time.sleep(0.2)
                continue
            for m in messages:
                received += 1
                rec = message_record(m)
                seen[rec["body"]] = seen.get(rec["body"], 0) + 1
                if "ack_bodies" in a:
                    do_ack = rec["body"] in a["ack_bodies"]
                else:
                    do_ack = ack_every and seen[rec["body"]] % ack_every == 0
                if do_ack:
                    consumer.ack(m)
                    acked += 1
                rec["acked"] = bool(do_ack)
                emit(a["out"], rec)
    finally:
        consumer.shutdown()
    return {"acked": acked, "received": received}


def push(a: dict[str, Any]) -> dict[str, Any]:
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    count = {"n": 0}
    done = threading.Event()
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message: Any) -> Any:
            if a.get("consume_s"):
                emit(a["out"], message_record(message))
                time.sleep(a["consume_s"])
                with lock:
                    emit(a["out"], {"consumed": message.body.decode(), "t": time.time()})
                    count["n"] += 1
                    if count["n"] >= a["expect"]:
                        done.set()
                return ConsumeResult.SUCCESS
            with lock:
                emit(a["out"], message_record(message))
                count["n"] += 1
                if count["n"] >= a["expect"]:
                    done.set()
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(client_config(a), a["group"], Listener(),
                            {a["topic"]: FilterExpression(a.get("expression", "*"))}, tls_enable=a.get("tls", False))
    consumer.startup()
    try:
        done.wait(a["timeout_s"])
    finally:
        consumer.shutdown()
    return {"consumed": count["n"]}


def transact(a: dict[str, Any]) -> dict[str, Any]:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    checks: list[str] = []
    checked = threading.Event()

    class Checker(TransactionChecker):
        def check(self, message: Any) -> Any:
            body = message.body.decode()
            emit(a["out"], {"checked": body, "message_id": message.message_id, "topic": message.topic,
                            "t": time.time()})
            checks.append(body)
            if len(checks) >= a.get("expect_checks", 0):
                checked.set()
            return getattr(TransactionResolution, a.get("check_answer", "COMMIT"))

    producer = Producer(client_config(a), (a["topic"],), Checker(), tls_enable=a.get("tls", False))
    producer.startup()
    ok = 0
    try:
        for seq, decision in enumerate(a["decisions"]):
            msg = Message()
            msg.topic = a["topic"]
            msg.body = f"{a['prefix']}-{seq}".encode()
            try:
                transaction = producer.begin_transaction()
                receipt = producer.send(msg, transaction)
                if decision == "commit":
                    transaction.commit()
                elif decision == "rollback":
                    transaction.rollback()
                emit(a["out"], {"seq": seq, "ok": True, "message_id": receipt.message_id, "decision": decision,
                                "t": time.time()})
                ok += 1
            except Exception as exc:
                emit(a["out"], {"seq": seq, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        if a.get("expect_checks"):
            checked.wait(a["timeout_s"])
        time.sleep(a.get("linger_s", 0))  # the checker's END_TRANSACTION answer leaves asynchronously
    finally:
        producer.shutdown()
    return {"sent": ok, "checks": len(checks)}


def main() -> None:
    args = json.loads(sys.argv[1])
    verb = {"produce": produce, "simple": simple, "push": push, "transact": transact}[args["verb"]]
    try:
        summary = verb(args)
    except Exception as exc:
        emit(args["out"], {"done": False, "error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    emit(args["out"], {"done": True, **summary})


if __name__ == "__main__":
    main()
