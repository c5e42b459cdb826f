"""The one exception tree of ferrymq.

```
FerryError
├── ConfigError                 bad configuration value (CLI exits 2)
├── StoreError                  the store cannot work (unusable dirs, corrupt files it cannot repair)
├── ProtocolError               malformed bytes on the wire (remoting frame/header, HA stream)
│   └── FrameTooLargeError      a length prefix above the named limit
├── RemotingError               transport-level failure; retriable
│   ├── ConnectError            could not connect
│   ├── ConnectionClosedError   the connection closed while a call was pending (carries the cause)
│   └── RemotingTimeoutError    no answer within timeout_ms
│       └── RequestTimeoutError no reply to Producer.request within timeout_ms
├── BrokerError                 a peer answered with a non-success response code (see for_code)
│   ├── TopicNotExistError      17
│   ├── NoPermissionError       16
│   ├── ServiceNotAvailableError 14
│   ├── SystemBusyError         2
│   └── MessageIllegalError     13
└── ClientError                 misuse of the client API, or no route/broker available
```
Expected outcomes (send status, pull status) are enums, not exceptions.
"""

from __future__ import annotations


class FerryError(Exception):
    """Base of every ferrymq error."""

    retriable: bool = False


class ConfigError(FerryError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class StoreError(FerryError):
    pass


class ProtocolError(FerryError):
    pass


class FrameTooLargeError(ProtocolError):
    pass


class RemotingError(FerryError):
    retriable = True


class ConnectError(RemotingError):
    pass


class ConnectionClosedError(RemotingError):
    pass


class RemotingTimeoutError(RemotingError):
    pass


class RequestTimeoutError(RemotingTimeoutError):
    """``Producer.request``: the request was sent but no reply came back within its timeout."""


class BrokerError(FerryError):
    """A response with a non-success code. ``code`` and ``remark`` come from the peer."""

    #: response codes after which a producer may retry on another broker
    RETRIABLE_CODES = frozenset({1, 2, 14, 16, 17, 204, 205, 215})

    def __init__(self, code: int, remark: str | None = None) -> None:
        super().__init__(f"code {code}: {remark or ''}".rstrip(": "))
        self.code = code
        self.remark = remark or ""
        self.retriable = code in self.RETRIABLE_CODES


class TopicNotExistError(BrokerError):
    pass


class NoPermissionError(BrokerError):
    pass


class ServiceNotAvailableError(BrokerError):
    pass


class SystemBusyError(BrokerError):
    pass


class MessageIllegalError(BrokerError):
    pass


class ClientError(FerryError):
    pass


_BY_CODE: dict[int, type[BrokerError]] = {
    17: TopicNotExistError,
    16: NoPermissionError,
    14: ServiceNotAvailableError,
    2: SystemBusyError,
    13: MessageIllegalError,
}


def for_code(code: int, remark: str | None = None) -> BrokerError:
    """The exception for a non-success response code."""
    return _BY_CODE.get(code, BrokerError)(code, remark)
