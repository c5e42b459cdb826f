"""Damaged bytes on disk never reach a consumer: a real broker is SIGKILLed, records in old and new
segments get bit flips (bit rot in a body or its BODYCRC), the log's tail is zeroed (lost on disk), and after
each restart every record a pull serves is byte-identical to what was sent, and nothing but the damaged and
the lost records is missing. Five rounds on one store."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from procs import ProcessGroup, request, start_broker, start_namesrv

from ferrymq.common.message_codec import RecordCheck, check_record, encode_batch_body, iter_records
from ferrymq.remoting.codes import RequestCode
from ferrymq.remoting.codes import ResponseCode as R
from support.wire import pull, send_v1

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]

TOPIC = "Damaged"
ROUNDS = 5
#: messages sent per round, in batches
PER_ROUND = 400
BATCH = 50
BODY_BYTES = 1500
SEGMENT_BYTES = 256 * 1024
#: records given a bit flip per round
FLIPS_PER_ROUND = 4
#: records of the log's tail zeroed (lost on disk) in every other round
ZEROED_TAIL = 7


def body_of(seq: int) -> bytes:
    head = b"%08d:" % seq
    digest = hashlib.sha256(head).digest()
    return (head + digest * (BODY_BYTES // len(digest) + 1))[:BODY_BYTES]


def seq_of(body: bytes) -> int:
    return int(body[:8])


def send_round(addr: str, first_seq: int) -> None:
    for start in range(first_seq, first_seq + PER_ROUND, BATCH):
        entries = [(0, body_of(s), f"UNIQ_KEY\x01U{s}\x02") for s in range(start, start + BATCH)]
        resp = request(addr, int(RequestCode.SEND_BATCH_MESSAGE), send_v1(TOPIC, 0, ""), encode_batch_body(entries))
        assert resp.code == R.SUCCESS, resp.remark


def record_positions(store: Path) -> list[tuple[Path, int, int]]:
    """(segment file, position, size) of every message record on disk, in log order."""
    out: list[tuple[Path, int, int]] = []
    for seg in sorted(p for p in (store / "commitlog").iterdir() if p.name.isdigit()):
        data = seg.read_bytes()
        pos = 0
        while True:
            status, size = check_record(data, pos, False, end=len(data))
            if status is not RecordCheck.OK:
                break
            out.append((seg, pos, size))
            pos += size
    return out


def damage(store: Path, rng: random.Random, zero_tail: bool) -> None:
    recs = record_positions(store)
    for seg, pos, _size in rng.sample(recs, FLIPS_PER_ROUND):
        with open(seg, "r+b") as fh:
            at = pos + rng.choice([8 + rng.randrange(4), 88 + rng.randrange(BODY_BYTES)])  # BODYCRC or body
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
    if zero_tail:
        seg, pos, _size = recs[-ZEROED_TAIL]
        with open(seg, "r+b") as fh:
            end = fh.seek(0, 2)
            fh.seek(pos)
            fh.write(bytes(end - pos))


def pull_everything(addr: str) -> tuple[list[int], int]:
    """Every record a consumer gets, following nextBeginOffset; (seqs, pulls answered MESSAGE_CORRUPT-like 20)."""
    seqs: list[int] = []
    retries = 0
    queue_offset = 0
    for _ in range(10_000):
        resp = request(addr, int(RequestCode.PULL_MESSAGE), pull(TOPIC, offset=queue_offset, sys_flag=4, max_msgs=64))
        if resp.code == R.SUCCESS:
            for msg in iter_records(resp.body):
                seq = seq_of(msg.body)
                assert msg.body == body_of(seq), f"a damaged body was served at queue offset {msg.queue_offset}"
                seqs.append(seq)
        elif resp.code == R.PULL_RETRY_IMMEDIATELY:
            retries += 1
        else:
            assert resp.code in (R.PULL_NOT_FOUND, R.PULL_OFFSET_MOVED), (resp.code, resp.remark)
            break
        nxt = int(resp.ext_fields["nextBeginOffset"])
        if nxt <= queue_offset:
            break
        queue_offset = nxt
    return seqs, retries


def test_damaged_records_are_never_served(procs: ProcessGroup) -> None:
    rng = random.Random(20261124)
    ns = start_namesrv(procs)
    broker = start_broker(procs, [ns.addr], mappedFileSizeCommitLog=SEGMENT_BYTES)
    sent = 0
    for rnd in range(ROUNDS):
        send_round(broker.addr, sent)
        sent += PER_ROUND
        broker.kill()
        damage(broker.store_dir, rng, zero_tail=rnd % 2 == 1)
        broker.start()
        seqs, _ = pull_everything(broker.addr)
        assert len(seqs) == len(set(seqs)), "a record was served twice"
        assert seqs == sorted(seqs)
        # what is missing is at most the flipped records and the zeroed tails, never the records after them
        assert len(seqs) >= sent - (rnd + 1) * FLIPS_PER_ROUND - ((rnd + 1) // 2) * ZEROED_TAIL, (len(seqs), sent)
    assert broker.proc is not None
    log = broker.proc.log_text()
    assert "corrupt record not served" in log or "invalid record" in log
