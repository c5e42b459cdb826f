"""The exactly-once Spark sink under a longer nemesis than CI runs (tests/spark/test_spark_exactly_once.py):
a streaming query topic A → transform → topic B in a driver subprocess against a name server and two brokers;
before each fault more rows go into A, then one of: SIGKILL a Python worker during a batch, SIGKILL the whole
driver between micro-batches, SIGKILL it during a commit (after the epoch records and a random number of
END_TRANSACTIONs); the driver restarts from the same checkpoint. At the end B is read and compared with A.

    python benchmarks/spark_exactly_once.py                    # 20 faults, exactly-once sink
    python benchmarks/spark_exactly_once.py --faults 6 --at-least-once   # the default sink, for contrast

Prints the faults by kind, rows, duplicates and missing rows; exits 1 when the exactly-once sink shows a
duplicate or a missing row. Not a test.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "acceptance"), str(ROOT / "tests" / "spark"), str(ROOT / "tests")]

from procs import ProcessGroup  # noqa: E402
from test_spark_exactly_once import Harness, run_nemesis  # noqa: E402

FAULT_KINDS = ("worker", "driver-between", "driver-commit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--at-least-once", action="store_true", help="the default sink (expect duplicates)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    plan = [rng.choice(FAULT_KINDS if not args.at_least_once else ("worker", "driver-during-batch"))
            for _ in range(args.faults)]  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="ferrymq-spark-eos-"))
    procs = ProcessGroup(base / "procs")
    started = time.monotonic()
    try:
        h = Harness(procs, base, exactly_once=not args.at_least_once)
        h.rng = rng
        h.start_cluster()
        run_nemesis(h, plan)
        h.finish()
        total, duplicates, missing = h.verdict()
    except BaseException:
        print(procs.dump())
        raise
    finally:
        procs.stop_all()
        print(f"working directory: {base}" if args.keep else "", end="")
        if not args.keep:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    sink = "at-least-once" if args.at_least_once else "exactly-once"
    print(f"sink {sink}, {time.monotonic() - started:.0f} s")
    print(f"faults {sum(h.faults.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(h.faults.items())))
    print(f"rows {h.rows} in A, {total} in B, duplicates {duplicates}, missing {missing}")
    return 1 if not args.at_least_once and (duplicates or missing) else 0


if __name__ == "__main__":
    sys.exit(main())
