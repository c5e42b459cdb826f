"""SQL92 selectors: RocketMQ's semantics (missing properties, type mismatches, parse-time checks), and a
hypothesis oracle: random selectors over random properties, evaluated by a plain recursive interpreter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.common.sql92 import SqlParseError, compile_selector, is_tag_type, parse_selector

# ---- examples ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "props", "expected"), [
    ("a > 3", {"a": "5"}, True),
    ("a > 3", {"a": "3"}, False),
    ("a >= 3", {"a": "3"}, True),
    ("a < 3", {"a": "-7"}, True),
    ("a <= 3", {"a": "4"}, False),
    ("a > 3", {}, False),                       # missing: unknown
    ("a > 3", {"a": "x"}, False),               # not a number: evaluation error, no match
    ("a > 3", {"a": "3.5"}, False),             # compared as Integer: "3.5" does not parse
    ("a > 3.0e0", {"a": "3.5"}, True),          # compared as Double
    ("a > 2147483648", {"a": "3000000000"}, True),  # Long literal
    ("a = 3", {"a": "3"}, True),
    ("a = 3", {"a": "03"}, True),               # Integer.valueOf("03") == 3
    ("a <> 3", {"a": "4"}, True),
    ("a <> 3", {}, False),
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'it''s'", {"a": "it's"}, True),
    ("a <> 'x'", {"a": "y"}, True),
    ("a = TRUE", {"a": "true"}, True),
    ("a = FALSE", {"a": "yes"}, True),          # Boolean.valueOf: anything but "true" is false
    ("a > b", {"a": "2.5", "b": "1"}, True),    # two properties: compared as doubles
    ("a > b", {"a": "x", "b": "1"}, False),
    ("a BETWEEN 1 AND 3", {"a": "1"}, True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, False),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a NOT BETWEEN 1 AND 3", {}, False),
    ("a BETWEEN -5 AND -1", {"a": "-3"}, True),
    ("TAGS IN ('TagA', 'TagB')", {"TAGS": "TagB"}, True),
    ("TAGS IN ('TagA', 'TagB')", {"TAGS": "TagC"}, False),
    ("TAGS NOT IN ('TagA')", {"TAGS": "TagC"}, True),
    ("TAGS NOT IN ('TagA')", {}, False),
    ("b IS NULL", {}, True),
    ("b IS NULL", {"b": ""}, False),
    ("b IS NOT NULL", {"b": ""}, True),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NOT FALSE", {}, True),
    ("a", {"a": "true"}, False),                # a property as a boolean: a string is not TRUE
    ("NOT (a = 1)", {"a": "2"}, True),
    ("NOT a = 1", {"a": "2"}, False),           # (NOT a) = 1, as RocketMQ parses it
    ("a = 1 OR b = 2", {"b": "2"}, True),       # unknown OR true
    ("a = 1 AND b = 2", {"b": "3"}, False),
    ("c = 1 OR a > 3", {"a": "x", "c": "1"}, True),   # short circuit: the bad operand is never evaluated
    ("a > 3 OR c = 1", {"a": "x", "c": "1"}, False),  # the error comes first: no match
    ("a = 'x' -- trailing comment", {"a": "x"}, True),
    ("/* lead */ a = 'x'", {"a": "x"}, True),
    ("a CONTAINS 'bc'", {"a": "abcd"}, True),
    ("a NOT STARTSWITH 'ab'", {"a": "xab"}, True),
    ("a ENDSWITH ''", {"a": "x"}, False),
    ("a between 1 and 3 and tags is not null", {"a": "2", "tags": "t"}, True),  # keywords in any case
])
def test_examples(expr: str, props: dict[str, str], expected: bool) -> None:
    assert compile_selector(expr).matches(props) is expected


@pytest.mark.parametrize(("expr", "fragment", "line", "column"), [
    ("a >", "unexpected end of input", 1, 4),
    ("a > > 3", "unexpected '>'", 1, 5),
    ("a = NULL", "NULL cannot be compared", 1, 3),
    ("a > 'x'", "cannot be compared", 1, 3),
    ("a BETWEEN 3 AND 1", "illegal values of BETWEEN", 1, 3),
    ("a BETWEEN 'a' AND 'b'", "cannot be compared", 1, 3),
    ("3", "will not result in a boolean", 1, 1),
    ("a = 1 AND 3", "will not result in a boolean", 1, 7),
    ("a > 0.0", "less than Double.MIN_VALUE", 1, 5),
    ("a = 9223372036854775808", "out of the long range", 1, 5),
    ("-a IN ('x')", "IN needs a property", 1, 4),
    ("a IN (1, 2)", "unexpected '1'", 1, 7),
    ("a == 1", "unexpected '='", 1, 4),
    ("a ! 1", "unexpected character '!'", 1, 3),
    ("a = 1\nAND AND b", "unexpected 'AND'", 2, 5),
    ("TRUE = 'x'", "cannot be compared", 1, 6),
])
def test_parse_errors_name_the_position(expr: str, fragment: str, line: int, column: int) -> None:
    with pytest.raises(SqlParseError) as info:
        parse_selector(expr)
    assert fragment in str(info.value)
    assert (info.value.line, info.value.column) == (line, column)
    assert f"line {line}, column {column}" in str(info.value)


def test_limits_and_cache() -> None:
    with pytest.raises(SqlParseError, match="empty"):
        parse_selector("  ")
    with pytest.raises(SqlParseError, match="above the limit"):
        parse_selector("a = 1 OR " * 5000 + "TRUE")
    assert compile_selector("x = 1") is compile_selector("x = 1")
    with pytest.raises(SqlParseError):  # failures are cached too, and raised again
        compile_selector("x = ")
    with pytest.raises(SqlParseError):
        compile_selector("x = ")


def test_tag_type() -> None:
    assert is_tag_type(None) and is_tag_type("") and is_tag_type("tag") and not is_tag_type("SQL92")


# ---- the oracle ---------------------------------------------------------------------------------------
# Expressions over properties p0..p2 whose values are ints, floats, words or missing; compared with int
# literals (Integer semantics: a value that is not an int32 is an error), strings (=, <> and IN only).

class Err(Exception):
    pass


@dataclass
class Cmp:
    prop: str
    op: str
    lit: Any

    def text(self) -> str:
        lit = f"'{self.lit}'" if isinstance(self.lit, str) else str(self.lit)
        return f"{self.prop} {self.op} {lit}"

    def ev(self, props: dict[str, str]) -> bool | None:
        v = props.get(self.prop)
        if v is None:
            return None
        if isinstance(self.lit, str):
            eq = v == self.lit
            return eq if self.op == "=" else not eq
        try:
            n = int(v)
        except ValueError:
            raise Err() from None
        if v.strip() != v or "_" in v or not -2**31 <= n < 2**31:
            raise Err()
        return {"=": n == self.lit, "<>": n != self.lit, ">": n > self.lit, ">=": n >= self.lit,
                "<": n < self.lit, "<=": n <= self.lit}[self.op]


@dataclass
class Between:
    prop: str
    low: int
    high: int
    negated: bool

    def text(self) -> str:
        return f"{self.prop} {'NOT ' if self.negated else ''}BETWEEN {self.low} AND {self.high}"

    def ev(self, props: dict[str, str]) -> bool | None:
        ge = Cmp(self.prop, "<" if self.negated else ">=", self.low).ev(props)
        if self.negated:
            if ge is True:
                return True
            gt = Cmp(self.prop, ">", self.high).ev(props)
            return True if gt is True else None if ge is None or gt is None else False
        if ge is False:
            return False
        le = Cmp(self.prop, "<=", self.high).ev(props)
        return False if le is False else None if ge is None or le is None else True


@dataclass
class In:
    prop: str
    items: list[str]
    negated: bool

    def text(self) -> str:
        return f"{self.prop} {'NOT ' if self.negated else ''}IN ({', '.join(repr(i) for i in self.items)})"

    def ev(self, props: dict[str, str]) -> bool | None:
        v = props.get(self.prop)
        return None if v is None else (v in self.items) != self.negated


@dataclass
class Null:
    prop: str
    negated: bool

    def text(self) -> str:
        return f"{self.prop} IS {'NOT ' if self.negated else ''}NULL"

    def ev(self, props: dict[str, str]) -> bool | None:
        return (props.get(self.prop) is None) != self.negated


@dataclass
class Const:
    value: bool

    def text(self) -> str:
        return "TRUE" if self.value else "FALSE"

    def ev(self, props: dict[str, str]) -> bool | None:
        return self.value


@dataclass
class Not:
    inner: Any

    def text(self) -> str:
        return f"NOT ({self.inner.text()})"

    def ev(self, props: dict[str, str]) -> bool | None:
        v = self.inner.ev(props)
        return None if v is None else not v


@dataclass
class Logic:
    op: str
    left: Any
    right: Any

    def text(self) -> str:
        return f"({self.left.text()}) {self.op} ({self.right.text()})"

    def ev(self, props: dict[str, str]) -> bool | None:
        stop = self.op == "OR"  # the value that decides at once
        lv = self.left.ev(props)
        if lv is stop:
            return stop
        rv = self.right.ev(props)
        if rv is stop:
            return stop
        return None if lv is None or rv is None else not stop


PROPS = ["p0", "p1", "p2"]
WORDS = ["x", "y", "TagA", "it's"]
ints = st.integers(-5, 5)
prop_names = st.sampled_from(PROPS)
leaves = st.one_of(
    st.builds(Cmp, prop_names, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), ints),
    st.builds(Cmp, prop_names, st.sampled_from(["=", "<>"]), st.sampled_from(WORDS)),
    st.builds(lambda p, a, b, n: Between(p, min(a, b), max(a, b), n), prop_names, ints, ints, st.booleans()),
    st.builds(In, prop_names, st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), st.booleans()),
    st.builds(Null, prop_names, st.booleans()),
    st.builds(Const, st.booleans()),
)
exprs = st.recursive(leaves, lambda sub: st.one_of(
    st.builds(Not, sub), st.builds(Logic, st.sampled_from(["AND", "OR"]), sub, sub)), max_leaves=8)
values = st.one_of(ints.map(str), st.sampled_from(WORDS), st.sampled_from(["2.5", " 3", "99999999999", "+4", ""]))
properties = st.dictionaries(prop_names, values)


def _sql_literal(item: str) -> str:
    return "'" + item.replace("'", "''") + "'"


In.text = lambda self: (  # type: ignore[method-assign]
    f"{self.prop} {'NOT ' if self.negated else ''}IN ({', '.join(_sql_literal(i) for i in self.items)})")
Cmp.text = lambda self: (  # type: ignore[method-assign]
    f"{self.prop} {self.op} {_sql_literal(self.lit) if isinstance(self.lit, str) else self.lit}")


@settings(max_examples=300, deadline=None)
@given(exprs, properties)
def test_matches_the_oracle(expr: Any, props: dict[str, str]) -> None:
    try:
        expected = expr.ev(props) is True
    except Err:
        expected = False
    assert compile_selector(expr.text()).matches(props) is expected, expr.text()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab1' ()=<>!-.,*/NOTANDISLEbetwn\n", max_size=30))
def test_any_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        sel = parse_selector(text)
    except SqlParseError as exc:
        assert exc.line >= 1 and exc.column >= 1, str(exc)
        return
    sel.matches({"a": "1", "b": "x"})  # evaluation never raises
