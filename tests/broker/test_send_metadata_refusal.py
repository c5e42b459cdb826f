"""A send that auto-creates its topic when topics.json's journal cannot be written (no file descriptor, no
disk) is refused with SERVICE_NOT_AVAILABLE and the cause, not answered SYSTEM_ERROR through a traceback; the
next send after the descriptors are back creates the topic and is stored."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from broker_helpers import Client, send_v1

from ferrymq.broker import config_file
from ferrymq.broker.app import BrokerController
from ferrymq.remoting.codes import ResponseCode


@pytest.mark.parametrize(("err", "words"), [(errno.EMFILE, "too many open files"), (errno.ENOSPC, "disk is full")])
async def test_auto_create_without_a_journal_write_is_refused_clearly(
        broker: BrokerController, client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        err: int, words: str) -> None:
    broker.topics.close_journal()  # the next append must open the journal file again
    real_open = os.open

    def failing_open(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith(config_file.JOURNAL_SUFFIX):
            raise OSError(err, os.strerror(err), path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(config_file.os, "open", failing_open)
    with caplog.at_level(logging.WARNING):
        resp = await client.call(10, send_v1("AutoUnderPressure"), b"x")
    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp.remark
    assert words in (resp.remark or "")
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    monkeypatch.setattr(config_file.os, "open", real_open)
    resp = await client.call(10, send_v1("AutoUnderPressure"), b"y")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
