from __future__ import annotations

from pathlib import Path

from ferrymq.store.consume_queue import BLANK_SIZE, BLANK_UNIT, UNIT, ConsumeQueue

FILE = 20 * 10  # 10 units per file


def _cq(tmp_path: Path) -> ConsumeQueue:
    return ConsumeQueue(str(tmp_path / "cq"), "T", 0, FILE)


def test_units_roll_and_reload(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(25):
        assert cq.put_unit(1000 + i * 100, 100, i, i)
    assert not cq.put_unit(1000, 100, 0, 3)  # already present: re-dispatch is a no-op
    assert cq.max_offset_in_queue == 25 and cq.min_offset_in_queue == 0
    assert [f.file_from_offset for f in cq.mfq.files] == [0, 200, 400]
    assert cq.get_unit(13) == (2300, 100, 13)
    assert cq.max_phy_end == 1000 + 24 * 100 + 100
    cq.flush()
    cq.close()
    again = _cq(tmp_path)
    again.load()
    again.correct_min_offset(0)
    assert again.max_offset_in_queue == 25 and again.max_phy_end == 3500
    assert again.get_units_buffer(18, 1000) == b"".join(
        UNIT.pack(1000 + i * 100, 100, i) for i in range(18, 20)
    )


def test_first_file_at_non_zero_offset_gets_blank_units(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    cq.put_unit(5000, 50, 7, 23)
    assert cq.mfq.files[0].file_from_offset == 400
    assert cq.mfq.files[0].mm[:60] == BLANK_UNIT * 3
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (23, 24)
    assert cq.get_unit(22) is None and cq.get_unit(23) == (5000, 50, 7)
    cq.close()
    again = _cq(tmp_path)
    again.load()
    again.correct_min_offset(0)  # blank units are skipped even though their phy offset is 0
    assert again.min_offset_in_queue == 23


def test_gap_is_filled_with_blanks(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    cq.put_unit(0, 10, 0, 0)
    cq.put_unit(100, 10, 0, 14)
    assert cq.max_offset_in_queue == 15
    assert cq.get_unit(5) is None
    assert UNIT.unpack_from(cq.mfq.files[1].mm, 0)[1] == BLANK_SIZE


def test_truncate_dirty_across_files(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(25):
        cq.put_unit(i * 100, 100, 0, i)
    cq.truncate_dirty(1250)  # units 0..12 point below 1250
    assert cq.max_offset_in_queue == 13 and cq.max_phy_end == 1300
    assert len(cq.mfq.files) == 2
    cq.truncate_dirty(0)
    assert cq.max_offset_in_queue == 0 and cq.max_phy_end == 0


def test_delete_expired_and_min_offset(tmp_path: Path) -> None:
    cq = _cq(tmp_path)
    for i in range(25):
        cq.put_unit(i * 100, 100, 0, i)
    assert cq.delete_expired(1250) == 1  # file [0,10) fully below; file [10,20) is not
    assert cq.min_offset_in_queue == 13
    assert cq.delete_expired(10_000) == 1  # never the last file
    assert cq.min_offset_in_queue == 25 == cq.max_offset_in_queue
