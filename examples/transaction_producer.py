"""Transactional producer: store a half message, run a local transaction, commit or roll back.

Run a name server and a broker first (for example `ferry quickstart` in another terminal and use the name
server address it prints), then: ``python examples/transaction_producer.py 127.0.0.1:9876``.
"""

from __future__ import annotations

import asyncio
import sys

from ferrymq.client import new_message
from ferrymq.client.transaction import LocalTransactionState, TransactionProducer

ORDERS: dict[str, bool] = {}


def execute_local(msg, arg):  # type: ignore[no-untyped-def]
    """The local transaction: here, recording the order; an odd order id fails and is rolled back."""
    order = msg.body.decode()
    ok = int(order.rsplit("-", 1)[1]) % 2 == 0
    ORDERS[order] = ok
    return LocalTransactionState.COMMIT_MESSAGE if ok else LocalTransactionState.ROLLBACK_MESSAGE


def check_local(msg):  # type: ignore[no-untyped-def]
    """The broker asks about a half message it has no decision for (e.g. after a crash of this process)."""
    ok = ORDERS.get(msg.body.decode())
    if ok is None:
        return LocalTransactionState.UNKNOW
    return LocalTransactionState.COMMIT_MESSAGE if ok else LocalTransactionState.ROLLBACK_MESSAGE


async def main(namesrv: str) -> None:
    async with TransactionProducer(namesrv, "example-orders", execute_local=execute_local,
                                   check_local=check_local) as producer:
        for i in range(4):
            result = await producer.send_in_transaction(new_message("ExampleOrders", f"order-{i}"))
            print(f"order-{i}: half {result.send_result.status.value}, local {result.local_state.value}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9876"))
