"""Pure message helpers: properties string, Java String.hashCode, offset msgId."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ferrymq.common.message import (
    decode_offset_msg_id,
    encode_offset_msg_id,
    java_string_hash,
    properties_to_string,
    string_to_properties,
    tags_hash_code,
)

names = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1)
values = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)))


@given(st.dictionaries(names, values))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert string_to_properties(properties_to_string(props)) == props


def test_properties_accept_trailing_separator_from_cpp_and_alions() -> None:
    raw = "KEYS\x01k0 k2\x02TAGS\x01TagA\x02UNIQ_KEY\x010100007F\x02WAIT\x01true\x02myprop\x01v\x02"
    assert string_to_properties(raw) == {
        "KEYS": "k0 k2", "TAGS": "TagA", "UNIQ_KEY": "0100007F", "WAIT": "true", "myprop": "v"}


def test_java_hash_matches_known_values() -> None:
    assert java_string_hash("TagA") == 2598919  # seen in the ali-ons codeSet capture
    assert java_string_hash("TagB") == 2598920
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -2147483648
    assert tags_hash_code(None) == 0


def test_offset_msg_id_matches_capture() -> None:
    assert encode_offset_msg_id("127.0.0.1", 20911, 0) == "7F000001000051AF0000000000000000"
    assert decode_offset_msg_id("7F000001000051AF0000000000000010") == ("127.0.0.1", 20911, 16)
