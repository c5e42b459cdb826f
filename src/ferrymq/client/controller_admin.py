"""A small admin client of the controllers (``ferry controller status``, ``ferry ha elect``).

Requests go to the Raft leader: each address is tried in turn; a 2007 CONTROLLER_NOT_LEADER answer with a
``leaderAddr`` ext field sends the request there next. While no controller knows a leader (an election
in progress) the whole round is retried a few times.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ferrymq.errors import BrokerError, ClientError, FerryError, ProtocolError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode, ResponseCode
from ferrymq.remoting.pool import ConnectionPool

DEFAULT_CONTROLLER_ADDR = "127.0.0.1:9880"
DEFAULT_TIMEOUT_MS = 3000
#: redirects followed for one request
MAX_REDIRECTS = 5
#: rounds over all addresses while no leader is known, and the pause between them
LEADER_ROUNDS = 5
LEADER_ROUND_PAUSE_MS = 400


def parse_addrs(text: str) -> list[str]:
    addrs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise ClientError("no controller address given")
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ClientError(f"controller address must be host:port, got {a!r}")
    return addrs


class ControllerAdmin:
    def __init__(self, addrs: str | list[str], *, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.addrs = parse_addrs(addrs) if isinstance(addrs, str) else list(addrs)
        self.timeout_ms = timeout_ms
        self.pool = ConnectionPool(connect_timeout_ms=timeout_ms)

    async def __aenter__(self) -> ControllerAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.pool.close()

    async def invoke_at(self, addr: str, code: int, ext: dict[str, Any] | None = None,
                        body: bytes = b"") -> RemotingCommand:
        return await self.pool.invoke(addr, RemotingCommand.request(code, ext, body), self.timeout_ms)

    async def invoke_leader(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"") -> RemotingCommand:
        """The leader's answer (any code but 2007); ClientError when no controller leads."""
        errors: list[str] = []
        for round_no in range(LEADER_ROUNDS):
            if round_no:
                await asyncio.sleep(LEADER_ROUND_PAUSE_MS / 1000)
            queue = list(self.addrs)
            redirects = 0
            seen: set[str] = set()
            while queue:
                addr = queue.pop(0)
                if addr in seen:
                    continue
                seen.add(addr)
                try:
                    resp = await self.invoke_at(addr, code, ext, body)
                except FerryError as exc:
                    errors.append(f"{addr}: {exc}")
                    continue
                if resp.code != ResponseCode.CONTROLLER_NOT_LEADER:
                    return resp
                leader = resp.ext_fields.get("leaderAddr")
                errors.append(f"{addr}: not the leader (leader {leader or 'unknown'})")
                if leader and leader not in seen and redirects < MAX_REDIRECTS:
                    redirects += 1
                    queue.insert(0, leader)
        detail = "; ".join(errors[-len(self.addrs) - MAX_REDIRECTS:])
        raise ClientError(f"no controller leader reachable among {';'.join(self.addrs)} ({detail})")

    @staticmethod
    def _body(resp: RemotingCommand) -> dict[str, Any]:
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(resp.code, resp.remark)
        try:
            obj = jsonx.loads(resp.body) if resp.body else {}
        except ValueError as exc:
            raise ProtocolError(f"controller answered a body that is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ProtocolError("controller answered a body that is not a JSON object")
        return obj

    async def sync_state_data(self, broker_name: str | None = None) -> list[dict[str, Any]]:
        resp = await self.invoke_leader(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                        {"brokerName": broker_name} if broker_name else None)
        groups = self._body(resp).get("groups", [])
        return [g for g in groups if isinstance(g, dict)]

    async def replica_info(self, broker_name: str) -> dict[str, Any]:
        return self._body(await self.invoke_leader(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                                   {"brokerName": broker_name}))

    async def elect(self, broker_name: str, broker_id: int | None = None) -> dict[str, Any]:
        ext: dict[str, Any] = {"brokerName": broker_name}
        if broker_id is not None:
            ext["brokerId"] = broker_id
        return self._body(await self.invoke_leader(RequestCode.CONTROLLER_ELECT_MASTER, ext))

    async def metadata(self) -> dict[str, Any]:
        """Raft metadata from the first controller that answers (any node answers 1005)."""
        errors = []
        for addr in self.addrs:
            try:
                return self._body(await self.invoke_at(addr, RequestCode.CONTROLLER_GET_METADATA_INFO))
            except FerryError as exc:
                errors.append(f"{addr}: {exc}")
        raise ClientError(f"no controller answered ({'; '.join(errors)})")
