"""cpp_scripts/consume.py (the push consumer script of the 1.x client, same arguments and output) run with the
2.1 client. Extra arguments: ``"orderly": true`` (an orderly push consumer: one thread per queue, the messages of
a queue in queue-offset order), ``"trace": true`` (message trace on), ``"max_cache": n`` (prefetch at most about
n messages per queue).
"""

from __future__ import annotations

from typing import Any

import _cpp21
import consume
from _cpp_common import args


def main() -> None:
    a = args()

    def make(group: str) -> Any:
        return _cpp21.new_push_consumer(group, orderly=bool(a.get("orderly")), trace=bool(a.get("trace")),
                                        max_cache=int(a.get("max_cache", 0)))

    consume.PushConsumer = make  # type: ignore[assignment]
    consume.main()


if __name__ == "__main__":
    main()
