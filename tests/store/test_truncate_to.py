"""MessageStore.truncate_to: the commit log, consume queues, index and checkpoint are cut at a record
boundary, on the native and the pure-Python path, and a SIGKILL at any step of it leaves a store that
recovers to a consistent state (the cut either happened or not) and can be cut again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_helpers import CL_SEGMENT, FakeClock, assert_cqs_match_commit_log, inner, make_config, scan_records

from ferrymq.store import MessageStore, speedups
from ferrymq.store.errors import StoreError
from ferrymq.store.results import GetMessageStatus, PutMessageStatus

TOPICS = ("TopicA", "TopicB")
QUEUES = 3
COUNT = 700  # about 3.5 segments of CL_SEGMENT
CUT_AT = 430  # the first message cut away


@pytest.fixture(params=["native", "pure"])
def path_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if speedups.EXTENSION is None:
            pytest.skip("the C extension is not built")
        monkeypatch.setattr(speedups, "NATIVE", speedups.EXTENSION)
    else:
        monkeypatch.setattr(speedups, "NATIVE", None)
    return str(request.param)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[[str], MessageStore]]:
    opened: list[MessageStore] = []

    def _open(name: str) -> MessageStore:
        store = MessageStore(make_config(tmp_path / name), FakeClock())
        store.load()
        opened.append(store)
        return store

    yield _open
    for store in opened:
        if store.running:
            store.shutdown()


def fill(store: MessageStore, start: int, count: int) -> list[int]:
    """Put messages start..start+count-1; returns each one's phy offset."""
    offsets = []
    for i in range(start, start + count):
        res = store.put_message(inner(TOPICS[i % 2], i % QUEUES, f"body-{i}".encode() * 20, keys=f"key{i}"))
        assert res.status is PutMessageStatus.PUT_OK
        assert res.append_result is not None
        offsets.append(res.append_result.wrote_offset)
    store.reput()
    return offsets


def expected_queue_max(count: int) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for i in range(count):
        key = (TOPICS[i % 2], i % QUEUES)
        out[key] = out.get(key, 0) + 1
    return out


def check_cut(store: MessageStore, cut: int, kept: int) -> None:
    assert store.max_phy_offset == cut
    assert_cqs_match_commit_log(store)
    assert len(scan_records(store)) == kept
    want = expected_queue_max(kept)
    for topic in TOPICS:
        for qid in range(QUEUES):
            assert store.get_max_offset_in_queue(topic, qid) == want.get((topic, qid), 0)
    assert store.reput_phy_offset <= cut


def test_truncate_to_cuts_log_queues_and_index(path_kind: str, stores: Callable[[str], MessageStore]) -> None:
    store = stores("a")
    offsets = fill(store, 0, COUNT)
    store.flush()
    store.flush_consume_queues()
    cut = offsets[CUT_AT]
    assert cut // CL_SEGMENT < offsets[-1] // CL_SEGMENT  # later segments exist
    assert store.query_message(TOPICS[CUT_AT % 2], f"key{CUT_AT}", 10, 0, 1 << 62).buffers
    store.truncate_to(cut)
    check_cut(store, cut, CUT_AT)
    # cut records are gone from every read path
    topic, qid = TOPICS[CUT_AT % 2], CUT_AT % QUEUES
    qoff = expected_queue_max(CUT_AT)[(topic, qid)]
    assert store.get_message("g", topic, qid, qoff, 1, None).status is not GetMessageStatus.FOUND
    assert not store.query_message(topic, f"key{CUT_AT}", 10, 0, 1 << 62).buffers
    assert store.query_message(TOPICS[0], "key0", 10, 0, 1 << 62).buffers
    # new writes continue the queues where the cut left them
    new_offsets = fill(store, 10_000, 50)
    assert new_offsets[0] == cut
    res = store.get_message("g", topic, qid, qoff, 1, None)
    assert res.status is GetMessageStatus.FOUND
    assert_cqs_match_commit_log(store)
    # a clean restart and a crash restart both keep exactly that
    end = store.max_phy_offset
    store.shutdown()
    again = stores("a")
    assert again.max_phy_offset == end
    assert_cqs_match_commit_log(again)
    again.close_abruptly()
    third = stores("a")
    assert third.max_phy_offset == end
    assert_cqs_match_commit_log(third)


def test_truncate_to_segment_start_and_whole_log(path_kind: str, stores: Callable[[str], MessageStore]) -> None:
    store = stores("a")
    offsets = fill(store, 0, COUNT)
    seg = CL_SEGMENT * 2
    kept = sum(1 for o in offsets if o < seg)
    store.truncate_to(seg)
    check_cut(store, seg, kept)
    store.truncate_to(store.max_phy_offset + 100)  # beyond the end: nothing happens
    check_cut(store, seg, kept)
    store.truncate_to(0)
    assert store.max_phy_offset == 0 and not store.commit_log.mfq.files
    for topic in TOPICS:
        for qid in range(QUEUES):
            assert store.get_max_offset_in_queue(topic, qid) == 0
    # a replica that lost everything takes a master's bytes again from anywhere
    master = stores("m")
    fill(master, 0, 40)
    data = master.read_from(0, master.max_phy_offset)
    assert store.append_at(0, data)
    store.reput()
    assert store.max_phy_offset == master.max_phy_offset
    assert_cqs_match_commit_log(store)


def test_truncate_to_refuses_a_cut_inside_a_record(stores: Callable[[str], MessageStore]) -> None:
    store = stores("a")
    offsets = fill(store, 0, 20)
    with pytest.raises(StoreError):
        store.truncate_to(offsets[5] + 7)
    assert len(scan_records(store)) == 20


# --- SIGKILL at every step ---------------------------------------------------------------------------

#: (what to patch, which call kills): each is a step boundary inside truncate_to
KILL_POINTS = [
    ("ferrymq.store.commit_log.CommitLog.truncate", 1),  # checkpoint lowered, log untouched
    ("ferrymq.store.mapped_file.MappedFile.destroy", 1),  # holder segment zeroed, later segments still there
    ("ferrymq.store.consume_queue.ConsumeQueue.truncate_dirty", 2),  # log cut, one queue cut
    ("ferrymq.store.index.IndexService.truncate_to", 1),  # queues cut, index not
    ("ferrymq.store.index.IndexFile.destroy", 1),  # inside the index step
    ("ferrymq.store.checkpoint.StoreCheckpoint.flush", 2),  # the final checkpoint write
]

CHILD = textwrap.dedent("""
    import importlib, json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from store_helpers import FakeClock, make_config, inner
    from ferrymq.store import MessageStore
    root, target, nth, count = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    store = MessageStore(make_config(root), FakeClock())
    store.load()
    offsets = []
    for i in range(count):
        res = store.put_message(inner(("TopicA", "TopicB")[i % 2], i % 3, f"body-{i}".encode() * 20, keys=f"key{i}"))
        offsets.append(res.append_result.wrote_offset)
    store.reput()
    store.flush()
    store.flush_consume_queues()
    cut = offsets[int(sys.argv[6])]
    print(json.dumps({"cut": cut, "max": store.max_phy_offset}), flush=True)
    mod_name, cls_name, meth = target.rsplit(".", 2)
    cls = getattr(importlib.import_module(mod_name), cls_name)
    original = getattr(cls, meth)
    calls = [0]
    def killer(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    setattr(cls, meth, killer)
    store.truncate_to(cut)
    print("not killed", flush=True)
""")


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
@pytest.mark.parametrize(("target", "nth"), KILL_POINTS, ids=[t.rsplit(".", 2)[1] + f".{t.rsplit('.', 1)[1]}#{n}"
                                                            for t, n in KILL_POINTS])
def test_sigkill_inside_truncate_to_recovers(tmp_path: Path, stores: Callable[[str], MessageStore], target: str,
                                             nth: int, pure: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not pure and speedups.EXTENSION is None:
        pytest.skip("the C extension is not built")
    monkeypatch.setattr(speedups, "NATIVE", None if pure else speedups.EXTENSION)
    env = dict(os.environ)
    env[speedups.PURE_PYTHON_ENV] = "1" if pure else "0"
    helpers_dir = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, helpers_dir, str(tmp_path / "a"), target, str(nth), str(COUNT), str(CUT_AT)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    info = json.loads(proc.stdout.splitlines()[0])
    cut, old_max = info["cut"], info["max"]
    store = stores("a")  # abnormal start: the abort file is still there
    assert store.last_start_was_abnormal
    assert store.max_phy_offset in (cut, old_max)
    kept = CUT_AT if store.max_phy_offset == cut else COUNT
    assert len(scan_records(store)) == kept
    assert_cqs_match_commit_log(store)
    want = expected_queue_max(kept)
    for topic in TOPICS:
        for qid in range(QUEUES):
            assert store.get_max_offset_in_queue(topic, qid) == want.get((topic, qid), 0)
    # the cut can be made (again) and the store goes on from it
    store.truncate_to(cut)
    check_cut(store, cut, CUT_AT)
    assert fill(store, 10_000, 10)[0] == cut
    assert_cqs_match_commit_log(store)
