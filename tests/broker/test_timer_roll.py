"""Timer messages against retention, in process on a manual clock: pending records are rolled (written again at
the log's end) as they age and the segments holding the records still needed are never deleted, so aggressive
retention and forced cleanups over many segment deletions lose no pending message; a crash between a roll and
the next checkpoint save neither loses nor duplicates one.

The manual clock stands in 2027 and the segment files were written now, so every segment is past
fileReservedTime for ``delete_expired_files``: it deletes all but the newest unless something holds them. Before
rolling and the retention pin existed, the first such call deleted the segments of the pending records and the
timer service skipped their units (the messages were lost)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from broker_helpers import Client, make_config, pull, records, send_v1, wait_for

from ferrymq.broker.app import BrokerController
from ferrymq.broker.timer import CHECKPOINT_FILE, retention_warning
from ferrymq.common.message import decode_offset_msg_id
from ferrymq.errors import ConfigError
from ferrymq.remoting.codes import ResponseCode as R
from support.clock import ManualClock

START_MS = 1_800_000_000_000
#: the smallest commit log segment: a few records each, so retention has many segments to delete
SEGMENT_BYTES = 4096
TOPIC = "Rolled"
FILLER = "Filler"


def _props(**props: Any) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def _config(store_dir: Path, **overrides: Any) -> Any:
    # no periodic checkpoint save during the test: the test saves (and skips saves to model a crash)
    return make_config(str(store_dir), mapped_file_size_commit_log=SEGMENT_BYTES,
                       flush_delay_offset_interval_ms=3_600_000, **overrides)


async def _tick(ctl: BrokerController) -> None:
    ctl.timer.wake()
    await wait_for(lambda: ctl.timer._soon is None and ctl.timer.caught_up, timeout_s=5)


class Run:
    """One broker at a time on ``store_dir`` and a client to it; what was delivered to TOPIC, by UNIQ_KEY."""

    def __init__(self, store_dir: Path, clock: ManualClock, **overrides: Any) -> None:
        self.store_dir = store_dir
        self.clock = clock
        self.overrides = overrides
        self.ctl: BrokerController | None = None
        self.client: Client | None = None
        self.delivered: Counter[str] = Counter()
        self.pulled_to = 0
        self.deleted_segments = 0

    async def start(self) -> BrokerController:
        self.ctl = BrokerController(_config(self.store_dir, **self.overrides), clock_ms=self.clock)
        await self.ctl.start()
        self.client = await Client().open(self.ctl.broker_addr)
        await _tick(self.ctl)
        return self.ctl

    async def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.ctl is not None:
            await self.ctl.stop()
            self.ctl = None

    async def send_timer(self, uniq: str, delay_s: int) -> Any:
        assert self.client is not None
        resp = await self.client.call(10, send_v1(TOPIC, 0, _props(UNIQ_KEY=uniq, TIMER_DELAY_SEC=delay_s)),
                                      b"t" * 300)
        assert resp.code == R.SUCCESS, resp.remark
        return resp

    async def fill(self, count: int) -> None:
        assert self.client is not None
        for _ in range(count):
            assert (await self.client.call(10, send_v1(FILLER), b"f" * 600)).code == R.SUCCESS

    async def pull_delivered(self) -> None:
        assert self.client is not None
        while True:
            resp = await self.client.call(11, pull(TOPIC, offset=self.pulled_to, suspend_ms=0))
            got = records(resp.body) if resp.code == R.SUCCESS else []
            if not got:
                return
            for msg in got:
                assert "TIMER_ROLL_FROM" not in msg.properties and "TIMER_OUT_MS" not in msg.properties
                self.delivered[msg.properties["UNIQ_KEY"]] += 1
            self.pulled_to = got[-1].queue_offset + 1

    async def step(self, advance_ms: int, *, save: bool = True) -> None:
        """Time passes; due messages are delivered and old records rolled; more traffic; retention runs (all
        segments are past fileReservedTime, and a forced cleanup besides); the periodic checkpoint save."""
        ctl = self.ctl
        assert ctl is not None
        self.clock.advance(advance_ms)
        await _tick(ctl)
        await self.pull_delivered()
        await self.fill(6)
        self.deleted_segments += ctl.store.delete_expired_files()
        self.deleted_segments += ctl.store.delete_expired_files(force_oldest=True)
        if save:
            ctl.timer.persist()


@pytest.fixture
async def run(tmp_path: Path) -> AsyncIterator[Run]:
    r = Run(tmp_path / "store", ManualClock(START_MS), timer_roll_window_sec=10)
    try:
        yield r
    finally:
        await r.stop()


async def test_pending_messages_outlive_many_segment_deletions_and_a_crash_mid_roll(run: Run, tmp_path: Path) -> None:
    ctl = await run.start()
    original_phys = []
    for i in range(24):  # due from 40 s to 155 s
        resp = await run.send_timer(f"K{i}", 40 + 5 * i)
        original_phys.append(decode_offset_msg_id(resp.ext_fields["msgId"])[2])
    recall = {"producerGroup": "pg", "topic": TOPIC, "recallHandle": resp.ext_fields["recallHandle"]}
    assert run.client is not None
    assert (await run.client.call(370, recall)).code == R.SUCCESS  # K23 recalled
    await _tick(ctl)
    assert ctl.timer.pending_count == 25

    # 20 s: rolls happened (window 10 s); the checkpoint is saved
    for _ in range(4):
        await run.step(5_000)
    saved = (tmp_path / "store" / "config" / CHECKPOINT_FILE).read_bytes()
    rolled_at_save = ctl.timer.rolled_total
    assert rolled_at_save >= 25 and run.deleted_segments > 0 and not run.delivered
    # 35 s: more rolls, no save since; then a crash (the saved checkpoint is the 20 s one)
    for _ in range(3):
        await run.step(5_000, save=False)
    assert ctl.timer.rolled_total >= rolled_at_save + 25 and not run.delivered
    await run.stop()
    (tmp_path / "store" / "config" / CHECKPOINT_FILE).write_bytes(saved)

    ctl = await run.start()
    # the rebuild read the units rolled after the save twice (the old one and its roll): the old ones are done
    assert ctl.timer.pending_count == 25, ctl.timer.pending_count
    for _ in range(26):  # to 165 s
        await run.step(5_000)
    assert run.delivered == Counter({f"K{i}": 1 for i in range(23)})
    assert ctl.timer.pending_count == 0 and ctl.timer.rolled_total > 0
    # every original record's segment is gone: rolling, not only holding the segments, kept the messages
    assert ctl.store.min_phy_offset > max(original_phys)
    assert run.deleted_segments >= 30, run.deleted_segments


async def test_without_rolling_the_segments_of_pending_records_are_held_until_delivery(tmp_path: Path) -> None:
    """A roll window beyond the delays (no roll): a forced cleanup deletes nothing from the oldest pending record on
    (the store says so once), and every message is delivered; then the segments go."""
    run = Run(tmp_path / "store", ManualClock(START_MS), timer_roll_window_sec=3600)
    try:
        ctl = await run.start()
        await run.fill(12)
        first = decode_offset_msg_id((await run.send_timer("H0", 30)).ext_fields["msgId"])[2]
        for i in range(1, 6):
            await run.send_timer(f"H{i}", 30 + i)
        for _ in range(5):  # to 25 s
            await run.step(5_000)
        assert run.deleted_segments > 0 and ctl.store.min_phy_offset <= first
        assert ctl.store.retention_held and ctl.timer.rolled_total == 0
        assert not run.delivered
        for _ in range(3):  # to 40 s
            await run.step(5_000)
        assert run.delivered == Counter({f"H{i}": 1 for i in range(6)})
        await run.step(1_000)
        assert ctl.store.min_phy_offset > first and not ctl.store.retention_held
    finally:
        await run.stop()


async def test_a_slave_holds_the_records_its_copied_checkpoint_counts_as_pending(run: Run, tmp_path: Path) -> None:
    """The pin follows the saved checkpoint (a slave's is its master's copy), not the in-memory progress: a unit
    done after the last save keeps its record, so a rebuild from that save still reads it."""
    ctl = await run.start()
    resp = await run.send_timer("S0", 5)
    phy = decode_offset_msg_id(resp.ext_fields["msgId"])[2]
    await run.fill(12)
    run.clock.advance(6_000)
    await _tick(ctl)
    assert ctl.timer.committed_offset == 1 and ctl.timer.saved_committed_offset == 0
    ctl.store.delete_expired_files()
    assert ctl.store.min_phy_offset <= phy
    ctl.timer.persist()
    ctl.store.delete_expired_files()
    assert ctl.store.min_phy_offset > phy
    saved = json.loads((tmp_path / "store" / "config" / CHECKPOINT_FILE).read_text())
    assert saved["queueOffset"] == 1


def test_a_roll_window_not_below_file_reserved_time_is_warned_about() -> None:
    assert retention_warning(24 * 3600, 72) is None
    text = retention_warning(72 * 3600, 72)
    assert text is not None and "timerRollWindowSec" in text and "fileReservedTime" in text


async def test_a_full_disk_held_by_pending_messages_refuses_new_timer_messages(tmp_path: Path) -> None:
    """diskSpaceCleanForciblyRatio 1% with cleanFileForciblyEnable (every real disk is above): the disk check's
    forced cleanup (every second) deletes the oldest segment up to the pending record's and is held there; new
    timer messages are refused with a clear answer (plain sends are not: the disk is below the warning level) until
    the pending one is delivered."""
    run = Run(tmp_path / "store", ManualClock(START_MS), timer_roll_window_sec=3600, disk_space_clean_forcibly_ratio=1,
              disk_max_used_space_ratio=1, clean_file_forcibly_enable=True)
    try:
        ctl = await run.start()
        await run.send_timer("P0", 30)
        await run.fill(12)
        await wait_for(lambda: ctl.store.retention_held, timeout_s=10)
        assert run.client is not None
        refused = await run.client.call(10, send_v1(TOPIC, 0, _props(UNIQ_KEY="P1", TIMER_DELAY_SEC=5)), b"x")
        assert refused.code == R.SERVICE_NOT_AVAILABLE, refused.remark
        assert "timer message refused" in refused.remark and "diskSpaceCleanForciblyRatio" in refused.remark
        assert (await run.client.call(10, send_v1(FILLER), b"plain")).code == R.SUCCESS
        run.clock.advance(30_000)
        await _tick(ctl)
        await run.pull_delivered()
        assert run.delivered == Counter({"P0": 1})
        ctl.timer.persist()
        await wait_for(lambda: not ctl.store.retention_held, timeout_s=10)
        await run.send_timer("P2", 5)
    finally:
        await run.stop()


def test_a_roll_window_of_zero_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="timerRollWindowSec"):
        _config(tmp_path / "store", timer_roll_window_sec=0).validate()
