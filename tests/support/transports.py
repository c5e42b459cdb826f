"""A stub asyncio transport for tests that drive a ``Connection`` without sockets: subclasses define
``write`` (what the peer does with the bytes); the rest of the transport surface is inert."""

from __future__ import annotations

from typing import Any

STUB_PEER = ("127.0.0.1", 1)


class StubTransport:
    """The transport methods ``Connection`` calls besides ``write``: a fixed peer address, never closing."""

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return STUB_PEER if key in ("peername", "sockname") else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass
