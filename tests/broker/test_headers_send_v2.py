"""SendHeader's single-letter (V2) fast path answers exactly like the general parser (round 3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.broker.headers import V2_TO_V1, SendHeader
from ferrymq.errors import ProtocolError
from ferrymq.remoting.codec import RemotingCommand

numbers = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.integers(-(10**18), 10**18).map(str),
    st.sampled_from(["", " 7 ", "1_000", "+5", "-0", "1.5", "1e3", "abc", "９", "9" * 18, "-" + "9" * 18,
                     str(2**63 - 1), str(-(2**63)), str(2**63), str(-(2**63) - 1), "0" * 25 + "1"]),
)
bools = st.sampled_from(["", "true", "false", "TRUE", " true ", "1", "0", "yes", "False"])
strings = st.sampled_from(["", "pg", "T", "TBW102", "WAIT\x01true\x02TAGS\x01A"])
V2_FIELDS = {"a": strings, "b": strings, "c": strings, "d": numbers, "e": numbers, "f": numbers, "g": numbers,
             "h": numbers, "i": strings, "j": numbers, "k": bools, "l": numbers, "m": bools, "n": strings}


def _outcome(cmd: RemotingCommand) -> SendHeader | str:
    try:
        return SendHeader.parse(cmd)
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


@settings(max_examples=400)
@given(st.fixed_dictionaries({}, optional=V2_FIELDS), st.sampled_from([310, 320]))
def test_v2_fast_path_equals_general_parser(fields: dict[str, str], code: int) -> None:
    fast = _outcome(RemotingCommand(code, dict(fields)))
    # the same header with V1 names never takes the fast path
    general = _outcome(RemotingCommand(code, {V2_TO_V1[k]: v for k, v in fields.items()}))
    assert fast == general


@pytest.mark.parametrize("value", [str(2**63), str(-(2**63) - 1), "9" * 19])
def test_v2_out_of_long_range_refused(value: str) -> None:
    fields = {"a": "pg", "b": "T", "g": value}
    with pytest.raises(ProtocolError, match="64-bit"):
        SendHeader.parse(RemotingCommand(310, fields))


def test_v2_long_and_int_range_edges_accepted() -> None:
    h = SendHeader.parse(RemotingCommand(310, {"b": "T", "g": str(2**63 - 1), "h": str(-(2**31))}))
    assert (h.born_timestamp, h.flag) == (2**63 - 1, -(2**31))
    h = SendHeader.parse(RemotingCommand(10, {"topic": "T", "sysFlag": str(2**31 - 1), "reconsumeTimes": "0"}))
    assert h.sys_flag == 2**31 - 1


@pytest.mark.parametrize("code, key", [(310, "h"), (310, "f"), (310, "j"), (310, "e"), (310, "d"), (310, "l"),
                                       (10, "flag"), (10, "sysFlag"), (10, "reconsumeTimes"), (10, "queueId")])
@pytest.mark.parametrize("value", [str(2**31), str(-(2**31) - 1), "99999999999", str(2**63 - 1)])
def test_int_fields_outside_the_int_range_refused(code: int, key: str, value: str) -> None:
    """flag, sysFlag, reconsumeTimes, queueId, ... are Java ints: a larger value is a clear ProtocolError (the
    send answers SYSTEM_ERROR with it), not a struct.error from the record encoder."""
    fields = {"a": "pg", "b": "T"} if code == 310 else {"producerGroup": "pg", "topic": "T"}
    fields[key] = value
    name = V2_TO_V1.get(key, key) if code == 310 else key
    with pytest.raises(ProtocolError, match=f"'{name}' is outside the 32-bit int range"):
        SendHeader.parse(RemotingCommand(code, fields))


_INT_LETTERS = ("d", "e", "f", "g", "h", "j")


@settings(max_examples=400)
@given(st.fixed_dictionaries({k: V2_FIELDS[k] for k in _INT_LETTERS},
                             optional={k: v for k, v in V2_FIELDS.items() if k not in _INT_LETTERS}),
       st.sampled_from([310, 320]))
def test_v2_fast_path_with_every_integer_letter_equals_general_parser(fields: dict[str, str], code: int) -> None:
    """Every integer letter present (what clients send): the one-lookup reading answers like the general one."""
    fast = _outcome(RemotingCommand(code, dict(fields)))
    general = _outcome(RemotingCommand(code, {V2_TO_V1[k]: v for k, v in fields.items()}))
    assert fast == general
