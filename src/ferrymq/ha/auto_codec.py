"""Sans-IO codec of the controller-mode HA stream (beside the classic ``codec``; not RocketMQ-wire compatible).

All integers big-endian. One TCP connection per slave; the master speaks first.

Master -> slave: hello (22 bytes)

| off | size | field    | type   | meaning                                                    |
|-----|------|----------|--------|------------------------------------------------------------|
| 0   | 4    | magic    | bytes  | ``FHA2``                                                   |
| 4   | 2    | version  | int16  | ``VERSION`` (1)                                            |
| 6   | 16   | nonce    | bytes  | random per connection; the slave's HMAC covers it          |

Slave -> master: handshake (``HANDSHAKE_FIXED`` + name + 16 per entry + mac bytes)

| off        | size | field          | type   | meaning                                                   |
|------------|------|----------------|--------|-----------------------------------------------------------|
| 0          | 4    | magic          | bytes  | ``FHA2``                                                  |
| 4          | 2    | version        | int16  | ``VERSION``                                               |
| 6          | 8    | replica_id     | int64  | the slave's brokerId (>= 1)                               |
| 14         | 8    | max_phy_offset | int64  | the slave's commit log max phy offset                     |
| 22         | 2    | name_len       | int16  | bytes of broker_name, 1..``MAX_BROKER_NAME_BYTES``        |
| 24         | 4    | entry_count    | int32  | n, 0..``MAX_HANDSHAKE_ENTRIES``                           |
| 28         | 1    | mac_len        | int8   | 0 (no ``haSecret``) or 32                                 |
| 29         | L    | broker_name    | utf-8  | must equal the master's brokerName                        |
| 29+L       | 16n  | entries        | 2×int64| the slave's epoch entries (epoch, start_phy_offset)       |
| 29+L+16n   | M    | mac            | bytes  | HMAC-SHA256(haSecret, nonce ‖ bytes [0, 29+L+16n))        |

Master -> slave: answer (``ANSWER_FIXED`` + 16 per entry)

| off | size | field          | type   | meaning                                                         |
|-----|------|----------------|--------|-----------------------------------------------------------------|
| 0   | 2    | status         | int16  | ``HandshakeStatus``; not OK: the master closes after the answer |
| 2   | 8    | master_epoch   | int64  | the master's current epoch                                      |
| 10  | 8    | truncate_to    | int64  | the slave cuts its log here (the common point), -1 if not OK    |
| 18  | 8    | master_max     | int64  | the master's max phy offset when it answered                    |
| 26  | 4    | entry_count    | int32  | n; the master's epoch entries follow                            |
| 30  | 16n  | entries        | 2×int64| (epoch, start_phy_offset)                                       |

Slave -> master: report (8 bytes): ack_phy_offset int64, the slave's max phy offset. The first report
(after the slave truncated) is where transfers start; every later one acknowledges.

Master -> slave: transfer (``TRANSFER_HEADER_SIZE`` + body; ``body_size == 0`` is a heartbeat)

| off | size | field          | type   | meaning                                                         |
|-----|------|----------------|--------|-----------------------------------------------------------------|
| 0   | 8    | master_epoch   | int64  | the sender's term; older than the slave knows: refused, dropped |
| 8   | 8    | data_epoch     | int64  | the epoch whose records the body holds (<= master_epoch)        |
| 16  | 8    | epoch_start    | int64  | data_epoch's start phy offset (<= phy_offset)                   |
| 24  | 8    | phy_offset     | int64  | first body byte                                                 |
| 32  | 8    | confirm_offset | int64  | the master's confirm offset (acked by the whole SyncStateSet)   |
| 40  | 4    | body_size      | int32  | raw commit log bytes that follow, <= ``MAX_TRANSFER_BODY_SIZE`` |

A transfer never spans two epochs: its body ends at or before the start of the next epoch.

The HMAC is computed here (``handshake_mac``) and compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ferrymq.errors import FrameTooLargeError, ProtocolError

MAGIC = b"FHA2"
VERSION = 1
NONCE_SIZE = 16
MAC_SIZE = 32
MAX_BROKER_NAME_BYTES = 255
#: most epoch entries one handshake or answer may carry
MAX_HANDSHAKE_ENTRIES = 10_000
MAX_TRANSFER_BODY_SIZE = 4 * 1024 * 1024

_HELLO = struct.Struct(">4sh16s")
_HS_FIXED = struct.Struct(">4shqqhib")
_ANSWER_FIXED = struct.Struct(">hqqqi")
_ENTRY = struct.Struct(">qq")
_REPORT = struct.Struct(">q")
_TRANSFER = struct.Struct(">qqqqqi")

HELLO_SIZE = _HELLO.size  # 22
HANDSHAKE_FIXED = _HS_FIXED.size  # 29
ANSWER_FIXED = _ANSWER_FIXED.size  # 30
ENTRY_SIZE = _ENTRY.size  # 16
REPORT_SIZE = _REPORT.size  # 8
TRANSFER_HEADER_SIZE = _TRANSFER.size  # 44


class HandshakeStatus(enum.IntEnum):
    OK = 0
    BAD_VERSION = 1
    WRONG_BROKER_NAME = 2
    AUTH_FAILED = 3
    BAD_REPLICA_ID = 4


@dataclass(frozen=True, slots=True)
class Handshake:
    replica_id: int
    broker_name: str
    max_phy_offset: int
    entries: tuple[tuple[int, int], ...]
    mac: bytes
    signed: bytes  # the bytes the mac covers (after the nonce)


@dataclass(frozen=True, slots=True)
class Answer:
    status: HandshakeStatus
    master_epoch: int
    truncate_to: int
    master_max: int
    entries: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class TransferHeader:
    master_epoch: int
    data_epoch: int
    epoch_start: int
    phy_offset: int
    confirm_offset: int
    body_size: int


def _entries_bytes(entries: Sequence[tuple[int, int]]) -> bytes:
    if len(entries) > MAX_HANDSHAKE_ENTRIES:
        raise ValueError(f"more than {MAX_HANDSHAKE_ENTRIES} epoch entries")
    return b"".join(_ENTRY.pack(e, s) for e, s in entries)


def _entries_of(data: bytes | memoryview) -> tuple[tuple[int, int], ...]:
    return tuple((int(e), int(s)) for e, s in _ENTRY.iter_unpack(data))


def handshake_mac(secret: bytes, nonce: bytes, signed: bytes) -> bytes:
    return hmac.new(secret, nonce + signed, hashlib.sha256).digest()


def verify_mac(secret: bytes, nonce: bytes, handshake: Handshake) -> bool:
    return hmac.compare_digest(handshake.mac, handshake_mac(secret, nonce, handshake.signed))


# --- hello -----------------------------------------------------------------------------------------

def encode_hello(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_SIZE:
        raise ValueError("nonce must be 16 bytes")
    return _HELLO.pack(MAGIC, VERSION, nonce)


def decode_hello(data: bytes) -> bytes:
    """The nonce; ProtocolError for another magic or version."""
    magic, version, nonce = _HELLO.unpack(data)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a controller-mode HA master (magic {magic!r}, version {version})")
    return bytes(nonce)


# --- handshake -------------------------------------------------------------------------------------

def encode_handshake(replica_id: int, broker_name: str, max_phy_offset: int, entries: Sequence[tuple[int, int]],
                     secret: bytes | None, nonce: bytes) -> bytes:
    name = broker_name.encode("utf-8")
    if not 0 < len(name) <= MAX_BROKER_NAME_BYTES:
        raise ValueError("broker name must be 1..255 bytes")
    mac_len = MAC_SIZE if secret else 0
    signed = _HS_FIXED.pack(MAGIC, VERSION, replica_id, max_phy_offset, len(name), len(entries), mac_len) \
        + name + _entries_bytes(entries)
    return signed + (handshake_mac(secret, nonce, signed) if secret else b"")


def handshake_rest_size(fixed: bytes) -> int:
    """Bytes that follow the ``HANDSHAKE_FIXED`` bytes; ProtocolError on bad magic or out-of-range counts
    (checked before anything more is read)."""
    magic, version, _rid, _max, name_len, count, mac_len = _HS_FIXED.unpack(fixed)
    if magic != MAGIC:
        raise ProtocolError(f"bad HA handshake magic {magic!r}")
    if not 0 < name_len <= MAX_BROKER_NAME_BYTES or not 0 <= count <= MAX_HANDSHAKE_ENTRIES \
            or mac_len not in (0, MAC_SIZE):
        raise ProtocolError(f"HA handshake out of range (name {name_len}, entries {count}, mac {mac_len})")
    return int(name_len + count * ENTRY_SIZE + mac_len)


def decode_handshake(data: bytes) -> tuple[int, Handshake]:
    """(version, handshake) from the complete handshake bytes."""
    fixed = data[:HANDSHAKE_FIXED]
    rest = handshake_rest_size(fixed)
    if len(data) != HANDSHAKE_FIXED + rest:
        raise ProtocolError(f"HA handshake of {len(data)} bytes, expected {HANDSHAKE_FIXED + rest}")
    _magic, version, replica_id, max_phy, name_len, count, mac_len = _HS_FIXED.unpack(fixed)
    pos = HANDSHAKE_FIXED
    try:
        name = data[pos : pos + name_len].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("HA handshake broker name is not utf-8") from exc
    pos += name_len
    entries = _entries_of(data[pos : pos + count * ENTRY_SIZE])
    pos += count * ENTRY_SIZE
    if max_phy < 0:
        raise ProtocolError(f"negative max phy offset in HA handshake: {max_phy}")
    return int(version), Handshake(int(replica_id), name, int(max_phy), entries, bytes(data[pos:]),
                                   bytes(data[:pos]))


# --- answer ----------------------------------------------------------------------------------------

def encode_answer(status: HandshakeStatus, master_epoch: int, truncate_to: int, master_max: int,
                  entries: Sequence[tuple[int, int]]) -> bytes:
    return _ANSWER_FIXED.pack(int(status), master_epoch, truncate_to, master_max, len(entries)) \
        + _entries_bytes(entries)


def answer_rest_size(fixed: bytes) -> int:
    count = _ANSWER_FIXED.unpack(fixed)[4]
    if not 0 <= count <= MAX_HANDSHAKE_ENTRIES:
        raise ProtocolError(f"HA answer with {count} entries")
    return int(count * ENTRY_SIZE)


def decode_answer(data: bytes) -> Answer:
    fixed = data[:ANSWER_FIXED]
    rest = answer_rest_size(fixed)
    if len(data) != ANSWER_FIXED + rest:
        raise ProtocolError(f"HA answer of {len(data)} bytes, expected {ANSWER_FIXED + rest}")
    status, epoch, cut, master_max, _count = _ANSWER_FIXED.unpack(fixed)
    try:
        st = HandshakeStatus(status)
    except ValueError as exc:
        raise ProtocolError(f"unknown HA answer status {status}") from exc
    return Answer(st, int(epoch), int(cut), int(master_max), _entries_of(data[ANSWER_FIXED:]))


# --- report ----------------------------------------------------------------------------------------

def encode_report(ack_phy_offset: int) -> bytes:
    return _REPORT.pack(ack_phy_offset)


def last_report(data: bytes | bytearray) -> int:
    """The last complete report in ``data`` (a whole number of reports)."""
    value = int(_REPORT.unpack_from(data, len(data) - REPORT_SIZE)[0])
    if value < 0:
        raise ProtocolError(f"negative phy offset in HA report: {value}")
    return value


# --- transfer --------------------------------------------------------------------------------------

def encode_transfer_header(master_epoch: int, data_epoch: int, epoch_start: int, phy_offset: int,
                           confirm_offset: int, body_size: int) -> bytes:
    if not 0 <= body_size <= MAX_TRANSFER_BODY_SIZE:
        raise ValueError(f"body size out of range: {body_size}")
    return _TRANSFER.pack(master_epoch, data_epoch, epoch_start, phy_offset, confirm_offset, body_size)


def decode_transfer_header(data: bytes) -> TransferHeader:
    master_epoch, data_epoch, epoch_start, phy, confirm, size = _TRANSFER.unpack(data)
    if size < 0 or phy < 0:
        raise ProtocolError(f"bad HA transfer header (phy {phy}, size {size})")
    if size > MAX_TRANSFER_BODY_SIZE:
        raise FrameTooLargeError(f"HA transfer body of {size} bytes exceeds {MAX_TRANSFER_BODY_SIZE}")
    if size and not (0 < data_epoch <= master_epoch and 0 <= epoch_start <= phy):
        raise ProtocolError(f"inconsistent HA transfer header (epochs {data_epoch}/{master_epoch}, start "
                            f"{epoch_start}, phy {phy})")
    return TransferHeader(int(master_epoch), int(data_epoch), int(epoch_start), int(phy), int(confirm), int(size))
