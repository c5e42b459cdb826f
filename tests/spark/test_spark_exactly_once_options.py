"""Options of the exactly-once sink: off by default, the topic option required, the timeout bounded."""

from __future__ import annotations

import pytest

from ferrymq.errors import ConfigError
from ferrymq.spark.options import DEFAULT_EXACTLY_ONCE_TIMEOUT_MS, parse_sink_options


def test_default_sink_is_not_exactly_once() -> None:
    opts = parse_sink_options({"nameServer": "127.0.0.1:9876", "topic": "T"})
    assert not opts.exactly_once and opts.exactly_once_timeout_ms == DEFAULT_EXACTLY_ONCE_TIMEOUT_MS


def test_exactly_once_options() -> None:
    opts = parse_sink_options({"nameServer": "n:1", "topic": "T", "exactlyonce": "true",
                               "exactlyOnce.timeoutMs": "600000"})
    assert opts.exactly_once and opts.exactly_once_timeout_ms == 600_000


@pytest.mark.parametrize(("options", "named"), [
    ({"exactlyOnce": "true"}, "exactlyOnce"),                                   # no topic option
    ({"topic": "T", "exactlyOnce": "maybe"}, "exactlyOnce"),
    ({"topic": "T", "exactlyOnce": "true", "exactlyOnce.timeoutMs": "1000"}, "exactlyOnce.timeoutMs"),
])  # fmt: skip
def test_bad_exactly_once_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_sink_options({"nameServer": "n:1", **options})
    assert named in str(info.value)
