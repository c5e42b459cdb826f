"""The ACL check in front of a dispatcher's handlers, and the ``plain_acl.yml`` it reads (reloaded when
the file's modification time changes; a file that no longer parses keeps the last good ACL)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection
from typing import Any

from ferrymq.acl.checker import check, half_topic_denial
from ferrymq.acl.config import AclConfig, parse_acl
from ferrymq.common.properties import read_config_text
from ferrymq.errors import ConfigError
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.connection import Connection, Dispatcher, Handler

log = logging.getLogger(__name__)

ACL_FILE_NAME = "plain_acl.yml"
#: how often (at most) a request looks at the file's modification time
RELOAD_CHECK_INTERVAL_S = 1.0


def read_acl_file(path: str) -> AclConfig:
    return parse_acl(read_config_text(path, "aclFile"), os.path.basename(path))


def _peer_ip(conn: Connection) -> str:
    return conn.peer_addr.rpartition(":")[0].strip("[]")


class AclGuard:
    """Holds the current ACL of one file and checks requests against it."""

    def __init__(self, path: str, *, reload_interval_s: float = RELOAD_CHECK_INTERVAL_S) -> None:
        self.path = path
        self._reload_interval_s = reload_interval_s
        self._mtime_ns = self._stat_mtime_ns()
        self.acl = read_acl_file(path)  # a start-up error (ConfigError) stops the server
        self._next_check = time.monotonic() + reload_interval_s
        #: the reason the newest file content was refused (None when the current ACL is the file's)
        self.last_reload_error: str | None = None

    def _stat_mtime_ns(self) -> int:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return -1

    def maybe_reload(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return
        self._next_check = now + self._reload_interval_s
        mtime_ns = self._stat_mtime_ns()
        if mtime_ns == self._mtime_ns:
            return
        self._mtime_ns = mtime_ns
        try:
            self.acl = read_acl_file(self.path)
        except ConfigError as exc:
            self.last_reload_error = str(exc)
            log.error("ACL file %s not reloaded, keeping the last good ACL: %s", self.path, exc)
            return
        self.last_reload_error = None
        log.info("ACL file %s reloaded (%d accounts)", self.path, len(self.acl.accounts))

    def reload_now(self) -> None:
        """Re-read the file at once (after this process changed it)."""
        self._next_check = 0.0
        self._mtime_ns = -2
        self.maybe_reload()

    def denial(self, conn: Connection, cmd: RemotingCommand) -> str | None:
        self.maybe_reload()
        return check(self.acl, _peer_ip(conn), cmd)

    def end_transaction_denial(self, conn: Connection, cmd: RemotingCommand, real_topic: str,
                               producer_group: str) -> str | None:
        """END_TRANSACTION's own check, once its handler knows the half message (checker.half_topic_denial)."""
        return half_topic_denial(self.acl, _peer_ip(conn), cmd, real_topic, producer_group)

    def guarded(self, handler: Handler) -> Handler:
        def guard(conn: Connection, cmd: RemotingCommand) -> Any:
            reason = self.denial(conn, cmd)
            if reason is not None:
                return cmd.response(ResponseCode.NO_PERMISSION, remark=reason)
            return handler(conn, cmd)

        return guard

    def install(self, dispatcher: Dispatcher, only: Collection[int] | None = None) -> None:
        """Put the check in front of every handler registered so far (or of those of ``only``)."""
        for code in dispatcher.codes():
            if only is not None and code not in only:
                continue
            handler = dispatcher.get(code)
            if handler is not None:
                dispatcher.register(code, self.guarded(handler))
