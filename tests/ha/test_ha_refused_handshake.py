"""A slave without ``haSecret`` talking to a master that has one says the master refused the handshake, not
"negative body size in HA transfer header" (the challenge's bytes read as a transfer header)."""

from __future__ import annotations

import struct

from ha_fakes import T0_MS, FakeCommitLog

from ferrymq.ha.auth import AUTH_VERSION, CHALLENGE
from ferrymq.ha.config import HAConfig
from ferrymq.ha.master_conn import CloseConnection
from ferrymq.ha.slave_conn import SlaveConnection
from support.clock import ManualClock

CFG = HAConfig(heartbeat_interval_ms=5000, housekeeping_interval_ms=20000, transfer_batch_size=1000)


def _challenge(nonce: bytes) -> bytes:
    return CHALLENGE.pack(b"FMQA", AUTH_VERSION, nonce)


def _close_reason(data: bytes) -> str:
    clock = ManualClock(T0_MS)
    s = SlaveConnection(FakeCommitLog(4096), now_ms=clock(), config=CFG)
    s.connection_made(clock())
    outs = s.receive_data(data, clock())
    assert isinstance(outs[-1], CloseConnection), outs
    return s.close_reason or ""


def test_master_challenge_is_reported_as_a_refused_handshake() -> None:
    # nonces whose bytes 3..6 (the "body size" of the misread header) are negative and too large
    for nonce in (b"\x00\x00\x00\xff\xff\xff\x00" + bytes(9), b"\x00\x00\x00\x7f\xff\xff\xff" + bytes(9)):
        reason = _close_reason(_challenge(nonce))
        assert "refused the handshake" in reason and "haSecret" in reason, reason
        assert "negative body size" not in reason


def test_other_bad_headers_keep_their_reason() -> None:
    reason = _close_reason(struct.pack(">qi", 0, -5))
    assert reason.startswith("bad transfer: negative body size")
