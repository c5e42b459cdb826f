"""Java value semantics of RocketMQ's SQL92 filter: the types a selector computes with and how two of
them compare (RocketMQ's ``ComparisonExpression`` with string conversion on, as its parser always sets).

| selector value            | Java type | here                  |
|---------------------------|-----------|-----------------------|
| message property          | String    | ``str``               |
| ``TRUE`` / ``FALSE``      | Boolean   | ``bool``              |
| integer literal in int32  | Integer   | ``int``               |
| other integer literal     | Long      | ``JLong`` (an ``int``)|
| literal with ``.``/``E``  | Double    | ``float``             |
| missing property, NULL    | null      | ``None``              |

A comparison of two different types converts one side (a property string is parsed as the number type
of the other side, ``Integer.valueOf`` style); a string that does not parse is an evaluation error,
which makes the whole selector not match the message (RocketMQ logs it and skips the message).
"""

from __future__ import annotations

import math
import re
from typing import Any

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1

#: ``Integer.parseInt`` / ``Long.parseLong`` accept an optional sign and ASCII digits only
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
#: ``Double.valueOf`` (decimal forms; hexadecimal floating literals are not supported)
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)\Z")


class JLong(int):
    """A Java ``Long`` value (plain ``int`` is a Java ``Integer``)."""

    __slots__ = ()


class EvalError(Exception):
    """What Java throws while evaluating (NumberFormatException, ClassCastException, ...)."""


def java_integer(text: str) -> int:
    if _JAVA_INTEGER.match(text):
        value = int(text)
        if INT_MIN <= value <= INT_MAX:
            return value
    raise EvalError(f"For input string: {text!r} (not an int)")


def java_long(text: str) -> JLong:
    if _JAVA_INTEGER.match(text):
        value = int(text)
        if LONG_MIN <= value <= LONG_MAX:
            return JLong(value)
    raise EvalError(f"For input string: {text!r} (not a long)")


def java_double(text: str) -> float:
    """``Double.valueOf``: leading/trailing characters <= U+0020 are trimmed first."""
    trimmed = text.strip("".join(map(chr, range(33))))
    if _JAVA_DOUBLE.match(trimmed):
        body = trimmed.rstrip("fFdD") if not trimmed.endswith(("NaN", "Infinity")) else trimmed
        if body.lstrip("+-") == "NaN":
            return math.nan
        if body.lstrip("+-") == "Infinity":
            return -math.inf if body.startswith("-") else math.inf
        return float(body)
    raise EvalError(f"For input string: {text!r} (not a double)")


def java_boolean(text: str) -> bool:
    return text.lower() == "true"


def _double_key(value: float) -> tuple[int, float]:
    """Order of ``Double.compareTo``: -0.0 < 0.0, NaN equal to itself and above everything."""
    if math.isnan(value):
        return (2, 0.0)
    if value == 0.0:
        return (1, 0.0) if math.copysign(1.0, value) > 0 else (0, 0.0)
    return (1, value) if value > 0 else (0, value)


def _same_type_compare(lv: Any, rv: Any) -> int:
    if type(lv) is float:
        a, b = _double_key(lv), _double_key(rv)
    else:
        a, b = lv, rv
    return (a > b) - (a < b)


def java_compare(lv: Any, rv: Any) -> int:
    """``ComparisonExpression.__compare(lv, rv, true)``: both non-null. Mismatched types that Java cannot
    convert compare as -1 (its quirk, kept); a failed string conversion raises ``EvalError``."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:  # Java casts the Boolean to String here: ClassCastException
                raise EvalError("a boolean cannot be compared with a string")
            return -1
        if lt is int:
            if rt is JLong:
                lv = JLong(lv)
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = java_integer(rv)
            else:
                return -1
        elif lt is JLong:
            if rt is int:
                rv = JLong(rv)
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = java_long(rv)
            else:
                return -1
        elif lt is float:
            if rt is int or rt is JLong:
                rv = float(rv)
            elif rt is str:
                rv = java_double(rv)
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = java_boolean(lv)
            elif rt is int:
                lv = java_integer(lv)
            elif rt is JLong:
                lv = java_long(lv)
            elif rt is float:
                lv = java_double(lv)
            else:
                return -1
        else:
            return -1
    return _same_type_compare(lv, rv)


def java_equals(lv: Any, rv: Any) -> bool:
    """``lv.equals(rv)`` for two non-null values (Double equality is by bits: NaN equals NaN, 0.0 is not -0.0)."""
    lt = type(lv)
    if lt is not type(rv):
        return False
    if lt is float:
        return _double_key(lv) == _double_key(rv)
    return bool(lv == rv)


def negate(value: Any) -> Any:
    """Unary minus: numbers only (with Java's overflow), anything else gives null."""
    t = type(value)
    if t is int:
        result = -value
        return result if result <= INT_MAX else INT_MIN  # -Integer.MIN_VALUE overflows to itself
    if t is JLong:
        result = -value
        return JLong(result if result <= LONG_MAX else LONG_MIN)
    if t is float:
        return -value
    return None
