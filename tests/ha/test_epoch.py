"""The epoch file (persistence, crash-safe rewrite, damage detection) and ``find_common_point`` against a
model of two replica logs that share a history and then diverge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.ha.epoch import EPOCH_FILE_NAME, EpochFile, end_of_epoch, find_common_point
from ferrymq.store.errors import StoreCorruptError

Record = tuple[int, int]  # (epoch, sequence number inside the epoch): one byte of a model log


def entries_of(log: list[Record], terms: list[int]) -> list[tuple[int, int]]:
    """Epoch entries of a model log whose master terms were ``terms`` (an empty term still starts where
    the log was when it began)."""
    out: list[tuple[int, int]] = []
    for epoch in terms:
        start = next((i for i, (e, _n) in enumerate(log) if e == epoch), None)
        if start is None:
            # no record: the term started where the previous terms' records ended
            start = sum(1 for e, _n in log if e < epoch)
        out.append((epoch, start))
    return out


@st.composite
def diverged_logs(draw: st.DrawFn) -> tuple[list[Record], list[int], list[Record], list[int]]:
    """Two logs sharing the terms up to epoch e, one holding a prefix of the other's epoch-e records, then
    each with its own later terms (disjoint epoch numbers, as the controller issues each once)."""
    shared_counts = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    shared_terms = list(range(1, len(shared_counts) + 1))
    base: list[Record] = [(e, n) for e, c in zip(shared_terms, shared_counts, strict=True) for n in range(c)]
    a_log, b_log = list(base), list(base)
    a_terms, b_terms = list(shared_terms), list(shared_terms)
    if shared_terms:
        e = shared_terms[-1]
        extra = draw(st.integers(0, 5))
        longer = draw(st.sampled_from(["a", "b"]))
        target = a_log if longer == "a" else b_log
        target.extend((e, shared_counts[-1] + n) for n in range(extra))
    later = draw(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 4)), max_size=5))
    epoch = len(shared_terms)
    for side, count in later:
        epoch += draw(st.integers(1, 3))
        log, terms = (a_log, a_terms) if side == "a" else (b_log, b_terms)
        terms.append(epoch)
        log.extend((epoch, n) for n in range(count))
    return a_log, a_terms, b_log, b_terms


def common_prefix(a: list[Record], b: list[Record]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=400, deadline=None)
@given(diverged_logs())
def test_find_common_point_is_the_common_prefix(logs: tuple[list[Record], list[int], list[Record], list[int]]
                                                ) -> None:
    a_log, a_terms, b_log, b_terms = logs
    a_entries, b_entries = entries_of(a_log, a_terms), entries_of(b_log, b_terms)
    want = common_prefix(a_log, b_log)
    assert find_common_point(a_entries, b_entries, len(a_log), len(b_log)) == want
    assert find_common_point(b_entries, a_entries, len(b_log), len(a_log)) == want


def test_find_common_point_cases() -> None:
    # a lagging slave: everything it has is common
    assert find_common_point([(1, 0), (2, 100)], [(1, 0), (2, 100), (3, 500)], 300, 900) == 300
    # an old master back with records the new master never got (epoch 2 ends at 250 on the master)
    assert find_common_point([(1, 0), (2, 100)], [(1, 0), (2, 100), (3, 250)], 400, 900) == 250
    # a replica with a term the master never saw: back to where the common epoch ends
    assert find_common_point([(1, 0), (3, 200)], [(1, 0), (2, 150)], 260, 900) == 150
    # nothing in common, or nothing at all
    assert find_common_point([(4, 0)], [(5, 0)], 10, 20) == 0
    assert find_common_point([], [(1, 0)], 0, 20) == 0
    assert end_of_epoch([(1, 0), (2, 100)], 1, 500) == 100
    assert end_of_epoch([(1, 0), (2, 100)], 2, 500) == 500
    assert end_of_epoch([(1, 0)], 7, 500) == -1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 1000)), max_size=12), st.integers(0, 20_000))
def test_epoch_file_round_trip_and_truncate(tmp_path_factory: pytest.TempPathFactory,
                                            steps: list[tuple[int, int]], cut: int) -> None:
    root = tmp_path_factory.mktemp("epoch")
    f = EpochFile.in_store(str(root))
    assert f.entries() == [] and f.last_epoch() == 0
    epoch, start = 0, 0
    expected: list[tuple[int, int]] = []
    for d_epoch, d_start in steps:
        epoch += d_epoch
        start += d_start
        f.append(epoch, start)
        expected.append((epoch, start))
    if expected:
        f.append(epoch, start)  # appending the last entry again changes nothing
    assert EpochFile.in_store(str(root)).entries() == expected
    assert f.last_epoch() == (expected[-1][0] if expected else 0)
    f.truncate_after(cut)
    kept = [(e, s) for e, s in expected if s < cut]
    assert f.entries() == kept
    assert EpochFile.in_store(str(root)).entries() == kept
    assert not (root / (EPOCH_FILE_NAME + ".tmp")).exists()


def test_epoch_file_refuses_going_back(tmp_path: Path) -> None:
    f = EpochFile.in_store(str(tmp_path))
    f.append(3, 100)
    with pytest.raises(ValueError):
        f.append(2, 200)
    with pytest.raises(ValueError):
        f.append(3, 200)
    with pytest.raises(ValueError):
        f.append(4, 50)
    f.append(4, 100)  # an empty term 3
    assert f.entries() == [(3, 100), (4, 100)]
    assert f.epoch_at(99) == 0 and f.epoch_at(100) == 4 and f.start_of(3) == 100


def test_damaged_epoch_file_is_an_error_and_a_stray_tmp_is_ignored(tmp_path: Path) -> None:
    f = EpochFile.in_store(str(tmp_path))
    f.append(1, 0)
    f.append(2, 4096)
    path = tmp_path / EPOCH_FILE_NAME
    # a crash after writing the temp file but before the rename: the old file is what counts
    (tmp_path / (EPOCH_FILE_NAME + ".tmp")).write_bytes(b"partial")
    assert EpochFile.in_store(str(tmp_path)).entries() == [(1, 0), (2, 4096)]
    f.append(3, 8192)  # and the next write replaces it
    assert EpochFile.in_store(str(tmp_path)).entries() == [(1, 0), (2, 4096), (3, 8192)]
    data = bytearray(path.read_bytes())
    for damage in (lambda d: d.__setitem__(14, d[14] ^ 1), lambda d: d.__delitem__(slice(-3, None)),
                   lambda d: d.__setitem__(0, 0)):
        broken = bytearray(data)
        damage(broken)
        path.write_bytes(bytes(broken))
        with pytest.raises(StoreCorruptError):
            EpochFile.in_store(str(tmp_path))
    os.unlink(path)
    assert EpochFile.in_store(str(tmp_path)).entries() == []
