"""SYNC_MASTER zero-loss trials: ``python benchmarks/ha_zero_loss.py [--trials N] [--seed S]``.

Each trial starts a namesrv, a SYNC_MASTER and its slave (real ``ferry`` processes under a tmp dir),
runs a producer loop, SIGKILLs the master at a random moment and checks that every SEND_OK message
is on the slave. Prints one line per trial and a summary: trials, SEND_OK total, lost total.
Exit code 1 if any SEND_OK message was lost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "acceptance"), str(ROOT / "tests")]

from procs import ProcessGroup  # noqa: E402
from test_ha import zero_loss_trial  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sent_total = lost_total = 0
    for i in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="ha-zero-loss-") as tmp:
            group = ProcessGroup(Path(tmp))
            t0 = time.monotonic()
            try:
                sent, lost = zero_loss_trial(group, args.seed + i)
            finally:
                group.stop_all()
            sent_total += sent
            lost_total += lost
            print(
                f"trial {i + 1}/{args.trials}: SEND_OK {sent}, lost {lost} ({time.monotonic() - t0:.1f} s)",
                flush=True,
            )
    print(f"trials={args.trials} send_ok={sent_total} lost={lost_total}")
    return 1 if lost_total else 0


if __name__ == "__main__":
    sys.exit(main())
