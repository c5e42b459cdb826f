"""The bench's worker processes (cli/bench_impl/mpwork.py): a failed worker's exception is on the first line of
the error, which is all a row of the table shows."""

from __future__ import annotations

import pytest

from ferrymq.cli.bench_impl.mpwork import WorkerFailed, run_workers


def test_a_failed_worker_names_its_exception_on_the_first_line() -> None:
    with pytest.raises(WorkerFailed) as info:
        run_workers("ferrymq.cli.bench_impl.workers:no_such_worker", [{}], run_s=1.0)
    first, _, rest = str(info.value).partition("\n")
    assert first.startswith("worker 0 failed: AttributeError:") and "no_such_worker" in first
    assert "Traceback (most recent call last)" in rest  # the whole traceback follows
