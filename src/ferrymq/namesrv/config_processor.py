"""The name server's runtime configuration: GET_NAMESRV_CONFIG (319) and UPDATE_NAMESRV_CONFIG (318).

| code | request              | body in                   | answer                                                   |
|------|----------------------|---------------------------|----------------------------------------------------------|
| 319  | GET_NAMESRV_CONFIG   |                           | every key as ``key=value`` lines (see masking below)     |
| 318  | UPDATE_NAMESRV_CONFIG| ``key=value`` lines       | SUCCESS (header ``persisted``: the namesrv.conf written, or ""); SYSTEM_ERROR naming a refused key |

| key (runtime-safe)            | takes effect                                            |
|-------------------------------|---------------------------------------------------------|
| scanNotActiveBrokerInterval   | after the current scan period (ms between expiry scans) |
| brokerChannelExpiredTime      | next scan (ms of silence after which a broker is dropped) |

Every other key (listenHost, listenPort, kvConfigPath, aclEnable, aclFile, enableControllerInNamesrv, the TLS
and controller keys) needs a restart and is refused with a remark naming it. An update is all or nothing. An
accepted update is written to the ``ferry namesrv -c`` file (lines replaced in place, missing keys appended).

GET_NAMESRV_CONFIG never sends a secret: a key that names a secret or password (``SECRET_KEY_WORDS``) is
answered as ``MASKED_VALUE`` to everyone. With aclEnable, keys naming files and directories
(``PATH_KEY_WORDS``: aclFile, kvConfigPath, the TLS certificate paths...) are left out of the answer unless
the request is signed by an admin account.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ferrymq.common.properties import parse_int, parse_properties, update_properties_file
from ferrymq.errors import ConfigError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R

log = logging.getLogger(__name__)

#: smallest scan period and expiry accepted (ms)
MIN_SCAN_INTERVAL_MS = 100
MIN_BROKER_EXPIRED_MS = 1_000
#: a key whose lower-cased name contains one of these is a secret: its value never goes over the wire
SECRET_KEY_WORDS = ("secret", "password", "passwd", "token")
#: a key whose lower-cased name contains one of these names a file or directory (hidden from non-admins)
PATH_KEY_WORDS = ("path", "file", "dir")
MASKED_VALUE = "******"


def is_secret_key(key: str) -> bool:
    low = key.lower()
    return any(w in low for w in SECRET_KEY_WORDS)


def is_path_key(key: str) -> bool:
    low = key.lower()
    return any(w in low for w in PATH_KEY_WORDS)


class NamesrvConfigProcessor:
    """``server`` is the NameServer (its ``scan_interval_ms``, ``routes.broker_expired_ms``, ``config_path`` and
    ``file_props``)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self._runtime: dict[str, tuple[Callable[[], int], Callable[[int], None], int]] = {
            "scanNotActiveBrokerInterval": (lambda: server.scan_interval_ms, self._set_scan, MIN_SCAN_INTERVAL_MS),
            "brokerChannelExpiredTime": (lambda: server.routes.broker_expired_ms, self._set_expiry,
                                         MIN_BROKER_EXPIRED_MS),
        }

    def _set_scan(self, value: int) -> None:
        self.server.scan_interval_ms = value

    def _set_expiry(self, value: int) -> None:
        self.server.routes.broker_expired_ms = value

    def register(self, d: Any) -> None:
        d.register(RequestCode.GET_NAMESRV_CONFIG, self.get_config)
        d.register(RequestCode.UPDATE_NAMESRV_CONFIG, self.update_config)

    def properties(self) -> dict[str, str]:
        props = dict(self.server.file_props)
        props.update({"listenHost": self.server.host, "listenPort": str(self.server.port),
                      "kvConfigPath": str(self.server.kv_config_path or "")})
        for key, (read, _apply, _minimum) in self._runtime.items():
            props[key] = str(read())
        return props

    def get_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        acl_on = getattr(self.server, "acl_guard", None) is not None
        show_paths = not acl_on or self.server.is_admin(conn, cmd)
        lines = []
        for key, value in sorted(self.properties().items()):
            if is_secret_key(key):
                value = MASKED_VALUE
            elif not show_paths and is_path_key(key):
                continue
            lines.append(f"{key}={value}\n")
        text = "".join(lines)
        return cmd.response(R.SUCCESS, body=text.encode())

    def update_config(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            updates = parse_properties(cmd.body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return cmd.response(R.SYSTEM_ERROR, remark=f"the config body is not UTF-8 text: {exc}")
        if not updates:
            return cmd.response(R.SYSTEM_ERROR, remark="no key=value line in the request body")
        values: dict[str, int] = {}
        for key, raw in updates.items():
            if key not in self._runtime:
                known = key in self.properties()
                why = "needs a restart (set it in namesrv.conf)" if known else "is not a name server key"
                return cmd.response(R.SYSTEM_ERROR, remark=f"{key} {why}; nothing was changed")
            try:
                values[key] = parse_int(key, raw, minimum=self._runtime[key][2])
            except ConfigError as exc:
                return cmd.response(R.SYSTEM_ERROR, remark=f"{exc}; nothing was changed")
        for key, value in values.items():
            self._runtime[key][1](value)
            log.info("name server config %s = %d (from %s)", key, value, getattr(conn, "peer_addr", "?"))
        persisted = ""
        path = self.server.config_path
        if path:
            try:
                update_properties_file(path, {k: str(v) for k, v in values.items()})
                persisted = path
            except OSError as exc:
                log.error("name server config applied but not written to %s: %s", path, exc)
        return cmd.response(R.SUCCESS, {"persisted": persisted})
