"""What the two sans-IO HA connection state machines share (``master_conn``, ``slave_conn``).

Each side keeps its own state table (a module-level ``_TABLE`` assigned to the class as ``_table``);
this base owns the table lookup, the ``receive_data`` / ``tick`` / ``close`` inputs, the outputs
both sides emit (``SendBytes``, ``CloseConnection``) and the close transition.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

from ferrymq.errors import ProtocolError
from ferrymq.ha.config import HAConfig

__all__ = ["CloseConnection", "ProtocolStateError", "SendBytes", "TableConnection"]


class ProtocolStateError(ProtocolError):
    """An input the state table has no entry for (a programming error in the driver)."""


@dataclass(frozen=True, slots=True)
class SendBytes:
    data: bytes


@dataclass(frozen=True, slots=True)
class CloseConnection:
    reason: str


_S = TypeVar("_S", bound=enum.Enum)
_I = TypeVar("_I", bound=enum.Enum)
_O = TypeVar("_O")


class TableConnection(Generic[_S, _I, _O]):
    """A connection driven by a (state, input) -> handler table; inputs RECEIVE, TICK, CLOSE."""

    _table: ClassVar[Mapping[tuple[Any, Any], Callable[..., list[Any]]]]

    def __init__(
        self, *, state: _S, closed_state: _S, inputs: type[_I], now_ms: int, config: HAConfig | None
    ) -> None:
        self.config = config or HAConfig()
        self.state = state
        self._closed_state = closed_state
        self._inputs = inputs
        self.last_read_ms = now_ms
        self.close_reason: str | None = None
        # the table keyed by member names: str hashing is C-level, Enum.__hash__ is Python-level
        self._by_name = {(st._name_, ev._name_): h for (st, ev), h in self._table.items()}

    # ---- public inputs -------------------------------------------------------------------------
    def receive_data(self, data: bytes, now_ms: int) -> list[_O]:
        handler = self._by_name.get((self.state._name_, "RECEIVE"))
        if handler is None:
            return self._dispatch(self._inputs["RECEIVE"], now_ms, data=data)  # raises
        return handler(self, now_ms, data=data)

    def tick(self, now_ms: int) -> list[_O]:
        return self._dispatch(self._inputs["TICK"], now_ms)

    def close(self, reason: str, now_ms: int = 0) -> list[_O]:
        return self._dispatch(self._inputs["CLOSE"], now_ms, reason=reason)

    # ---- table ---------------------------------------------------------------------------------
    def _dispatch(self, event: _I, now_ms: int, **kw: object) -> list[_O]:
        handler = self._by_name.get((self.state._name_, event._name_))
        if handler is None:
            raise ProtocolStateError(f"no transition for {self.state.name} + {event.name}")
        return handler(self, now_ms, **kw)

    def _ignore(self, now_ms: int, **_: object) -> list[_O]:
        return []

    def _do_close(self, now_ms: int, reason: object = "closed", **_: object) -> list[_O]:
        self.state = self._closed_state
        self.close_reason = str(reason)
        return cast("list[_O]", [CloseConnection(self.close_reason)])
