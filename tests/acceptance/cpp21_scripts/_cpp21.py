"""Shared bits of the C++ 2.1 client scripts (run in subprocesses with the 2.1 client first on PYTHONPATH,
never imported by pytest).

Importing this module puts ../cpp_scripts on sys.path (the 1.x scripts' helpers: JSON argument, JSON-lines
output, the expected message of a sequence number) and fails at once unless the ``rocketmq`` module found is
the 2.1 client (PyPI ``rocketmq-python-cvs``), not the 1.x one installed in the test environment.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "cpp_scripts"))

from rocketmq.client import Producer, PushConsumer  # noqa: E402
from rocketmq.ffi import dll  # noqa: E402

#: what the bundled librocketmq reports, e.g. "CPP CORE VERSION: 2.1.0_cvs, BUILD TIME: ..."
EXPECTED_VERSION_PREFIX = "CPP CORE VERSION: 2.1."


def client_version() -> str:
    show = dll.ShowProducerVersion
    show.argtypes = [ctypes.c_void_p]
    show.restype = ctypes.c_char_p
    producer = Producer("cpp21-version-probe")
    producer.set_log_root_path(log_dir())  # the process's first client: it decides where the log goes
    return str(show(producer._handle).decode())


def log_dir() -> str:
    """Where the scripts ask librocketmq to log: ``$HOME/logs/rocketmq-cpp`` like the 1.x client (HOME is in the
    test's tmp dir). Left alone, this build logs to ``/logs/rocketmq-client/`` whatever HOME says."""
    path = os.path.join(os.environ.get("HOME", "."), "logs", "rocketmq-cpp")
    os.makedirs(path, exist_ok=True)
    return path


#: environment variable: librocketmq's log level for the scripts' producers (1 fatal ... 5 debug, 6 trace)
LOG_LEVEL_ENV = "CPP21_LOG_LEVEL"


def new_producer(group: str) -> Producer:
    producer = Producer(group)
    producer.set_log_root_path(log_dir())
    if os.environ.get(LOG_LEVEL_ENV):
        dll.SetProducerLogLevel(producer._handle, int(os.environ[LOG_LEVEL_ENV]))
    return producer


#: CTraceModel of the C API (include/CCommon.h): OPEN = 0
TRACE_OPEN = 0


def new_push_consumer(group: str, *, orderly: bool = False, trace: bool = False, max_cache: int = 0) -> Any:
    """A PushConsumer logging under HOME; ``trace`` turns message trace on, ``max_cache`` (> 0) caps the messages
    it prefetches per queue (the client's default is 1000)."""
    consumer = PushConsumer(group, orderly=orderly)
    consumer.set_log_root_path(log_dir())
    if max_cache > 0:
        dll.SetPushConsumerMaxCacheMessageSize.argtypes = [ctypes.c_void_p, ctypes.c_int]
        if dll.SetPushConsumerMaxCacheMessageSize(consumer._handle, max_cache) != 0:
            raise SystemExit("SetPushConsumerMaxCacheMessageSize failed")
    if trace:
        dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
        if dll.SetPushConsumerMessageTrace(consumer._handle, TRACE_OPEN) != 0:
            raise SystemExit("SetPushConsumerMessageTrace failed")
    return consumer


CLIENT_VERSION = client_version()
if not CLIENT_VERSION.startswith(EXPECTED_VERSION_PREFIX):
    raise SystemExit(f"expected the C++ 2.1 client, loaded {CLIENT_VERSION!r} from {dll._name}")
