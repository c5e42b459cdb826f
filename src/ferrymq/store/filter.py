"""Message filters used by ``MessageStore.get_message``: tags (§2.7 PULL) and SQL92 selectors on properties."""

from __future__ import annotations

from typing import Protocol

from ferrymq.common.message import PROPERTY_TAGS, java_string_hash, string_to_properties
from ferrymq.common.message_codec import decode_record_meta
from ferrymq.common.sql92 import Selector

SUB_ALL = "*"


class MessageFilter(Protocol):
    def is_matched_by_consume_queue(self, tags_code: int) -> bool: ...

    def is_matched_by_commit_log(self, record: bytes) -> bool: ...


def parse_subscription(sub_string: str | None) -> tuple[frozenset[str], frozenset[int]] | None:
    """None for "all" ("*", "" or None); else (tags, Java hash codes) from ``"a || b"``."""
    if sub_string is None:
        return None
    text = sub_string.strip()
    if not text or text == SUB_ALL:
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        return None
    return tags, frozenset(java_string_hash(t) for t in tags)


class TagFilter:
    """Tag subscription: CQ check by hash code, then exact check of the record's TAGS."""

    __slots__ = ("tags", "codes", "match_all")

    def __init__(self, sub_string: str | None) -> None:
        parsed = parse_subscription(sub_string)
        self.match_all = parsed is None
        self.tags: frozenset[str] = parsed[0] if parsed else frozenset()
        self.codes: frozenset[int] = parsed[1] if parsed else frozenset()

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return self.match_all or tags_code in self.codes

    def is_matched_by_commit_log(self, record: bytes) -> bool:
        if self.match_all:
            return True
        try:
            properties = decode_record_meta(record, 0).properties
        except (ValueError, IndexError):  # struct.error is a ValueError
            return False
        tags = string_to_properties(properties).get(PROPERTY_TAGS)
        return tags is not None and tags in self.tags


class SqlFilter:
    """SQL92 subscription: every consume queue entry passes (no Bloom prefilter); the record's properties
    (TAGS included) go through the compiled selector, and only TRUE matches."""

    __slots__ = ("selector",)

    def __init__(self, selector: Selector) -> None:
        self.selector = selector

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        return True

    def is_matched_by_commit_log(self, record: bytes) -> bool:
        try:
            properties = decode_record_meta(record, 0).properties
        except (ValueError, IndexError):
            return False
        return self.selector.matches(string_to_properties(properties))
