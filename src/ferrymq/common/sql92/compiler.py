"""Parse a SQL92 selector (lark, LALR) and compile it into a closure over a message's properties.

``compile_selector(text)`` returns a ``Selector`` whose ``matches(properties)`` is True only when the
expression evaluates to TRUE: a missing property makes a comparison unknown (null) and unknown does not
match; an evaluation error (a property that does not parse as the number it is compared with) does not
match either. The checks RocketMQ makes while parsing are made here too and raise ``SqlParseError``:
``=``/``<>`` with a NULL literal, ``<``/``>``/BETWEEN with a string or boolean operand, ``BETWEEN``
bounds in the wrong order, ``IN`` on anything but a property, AND/OR/NOT on a value that is not
boolean, float literals that are infinite or below ``Double.MIN_VALUE`` (so ``0.0`` is refused, as in
RocketMQ), integer literals beyond the long range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from ferrymq.common.sql92.values import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    EvalError,
    JLong,
    java_compare,
    java_equals,
    negate,
)

#: selectors longer than this are refused before parsing (RocketMQ has no limit; a subscription travels
#: in every heartbeat and pull, so a bound keeps one client from making the broker parse megabytes)
SELECTOR_CHARS_MAX = 16 * 1024
#: compiled selectors kept by ``compile_selector`` (least recently used dropped first)
COMPILE_CACHE_ENTRIES = 1024
#: smallest positive double (Java's ``Double.MIN_VALUE``): float literals below it are refused
DOUBLE_MIN_VALUE = 5e-324

GRAMMAR = r"""
start: or_expr

?or_expr: and_expr
    | or_expr OR and_expr                          -> or_

?and_expr: eq_expr
    | and_expr AND eq_expr                         -> and_

?eq_expr: cmp_expr
    | eq_expr EQ cmp_expr                          -> eq
    | eq_expr NE cmp_expr                          -> ne
    | eq_expr IS NULL                              -> is_null
    | eq_expr IS NOT NULL                          -> is_not_null

?cmp_expr: unary
    | cmp_expr GT unary                            -> gt
    | cmp_expr GE unary                            -> ge
    | cmp_expr LT unary                            -> lt
    | cmp_expr LE unary                            -> le
    | cmp_expr BETWEEN unary AND unary             -> between
    | cmp_expr NOT BETWEEN unary AND unary         -> not_between
    | cmp_expr IN "(" string_list ")"              -> in_
    | cmp_expr NOT IN "(" string_list ")"          -> not_in
    | cmp_expr CONTAINS STRING                     -> contains
    | cmp_expr NOT CONTAINS STRING                 -> not_contains
    | cmp_expr STARTSWITH STRING                   -> startswith
    | cmp_expr NOT STARTSWITH STRING               -> not_startswith
    | cmp_expr ENDSWITH STRING                     -> endswith
    | cmp_expr NOT ENDSWITH STRING                 -> not_endswith

?unary: primary
    | "+" unary                                    -> pos
    | "-" unary                                    -> neg
    | NOT unary                                    -> not_

?primary: STRING                                   -> string
    | NUMBER                                       -> number
    | TRUE                                         -> true
    | FALSE                                        -> false
    | NULL                                         -> null
    | ID                                           -> prop
    | "(" or_expr ")"

string_list: STRING ("," STRING)*

EQ: "="
NE: "<>"
GT: ">"
GE: ">="
LT: "<"
LE: "<="
NOT: "NOT"i
AND: "AND"i
OR: "OR"i
BETWEEN: "BETWEEN"i
IN: "IN"i
TRUE: "TRUE"i
FALSE: "FALSE"i
NULL: "NULL"i
IS: "IS"i
CONTAINS: "CONTAINS"i
STARTSWITH: "STARTSWITH"i
ENDSWITH: "ENDSWITH"i

// floats first: the regex alternation takes the first alternative that matches
NUMBER: /([0-9]+\.[0-9]*(e[+-]?[0-9]+)?|\.[0-9]+(e[+-]?[0-9]+)?|[0-9]+e[+-]?[0-9]+|0|[1-9][0-9]*l?)/i
STRING: /'([^']|'')*'/
ID: /[a-z_$][a-z0-9_$]*/i

LINE_COMMENT: /--[^\n\r]*/
BLOCK_COMMENT: /\/\*(.|\n)*?\*\//
WS: /[ \t\n\r\f]+/

%ignore WS
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""

Props = Mapping[str, str]
Eval = Callable[[Props], Any]

# node kinds (what RocketMQ's parse-time checks look at)
CONST = "constant"          # string / number literal
BOOL_CONST = "boolean constant"  # TRUE, FALSE, NULL
PROPERTY = "property"
BOOLEAN = "boolean expression"  # comparisons, AND/OR/NOT, IN, ...
VALUE = "value"             # a negation


class SqlParseError(ValueError):
    """A selector that does not parse or fails RocketMQ's parse-time checks; ``line``/``column`` are
    1-based (0 when the error has no single position)."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        where = f" at line {line}, column {column}" if line else ""
        super().__init__(f"{message}{where}")
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class Node:
    kind: str
    fn: Eval
    value: Any = None  # the literal of a CONST / BOOL_CONST
    text: str = ""     # for error messages

    def describe(self) -> str:
        return self.text or self.kind


class _CheckError(Exception):
    """A parse-time check failed at ``token`` (raised inside the transformer)."""

    def __init__(self, message: str, token: Token | None) -> None:
        super().__init__(message)
        self.token = token


def _const(value: Any, kind: str, text: str) -> Node:
    return Node(kind, lambda props: value, value, text)


def _as_boolean(node: Node, token: Token | None) -> Node:
    """RocketMQ's ``asBooleanExpression``: boolean expressions pass, a property is cast (a string is not
    TRUE), anything else is refused."""
    if node.kind in (BOOLEAN, BOOL_CONST):
        return node
    if node.kind == PROPERTY:
        inner = node.fn

        def cast(props: Props) -> Any:
            value = inner(props)
            if value is None:
                return None
            return value if type(value) is bool else False
        return Node(BOOLEAN, cast, text=node.text)
    raise _CheckError(f"expression will not result in a boolean value: {node.describe()}", token)


def _check_less_than_operand(node: Node, token: Token | None) -> None:
    if node.kind == CONST and not isinstance(node.value, str):
        return
    if node.kind in (CONST, BOOL_CONST, BOOLEAN):
        raise _CheckError(f"value {node.describe()} cannot be compared with < <= > >=", token)


def _check_equal_operands(left: Node, right: Node, token: Token | None) -> None:
    for node in (left, right):
        if node.kind == BOOL_CONST and node.value is None:
            raise _CheckError("NULL cannot be compared with = or <>; use IS [NOT] NULL", token)
    if left.kind == BOOL_CONST and right.kind == CONST:
        raise _CheckError(f"{left.describe()} cannot be compared with {right.describe()}", token)


def _equal_fn(left: Eval, right: Eval) -> Eval:
    def equal(props: Props) -> Any:
        lv = left(props)
        rv = right(props)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        if java_equals(lv, rv):
            return True
        return java_compare(lv, rv) == 0
    return equal


def _not_fn(inner: Eval) -> Eval:
    def negated(props: Props) -> Any:
        value = inner(props)
        return None if value is None else not value
    return negated


def _order_fn(left: Eval, right: Eval, accept: Callable[[int], bool]) -> Eval:
    """``<`` ``<=`` ``>`` ``>=``: two strings are compared as doubles (an error if either does not parse)."""
    from ferrymq.common.sql92.values import java_double

    def order(props: Props) -> Any:
        lv = left(props)
        if lv is None:
            return None
        rv = right(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            lv, rv = java_double(lv), java_double(rv)
        return accept(java_compare(lv, rv))
    return order


def _and_fn(left: Eval, right: Eval) -> Eval:
    def conj(props: Props) -> Any:
        lv = left(props)
        if lv is False:
            return False
        rv = right(props)
        if rv is False:
            return False
        if lv is None or rv is None:
            return None
        return True
    return conj


def _or_fn(left: Eval, right: Eval) -> Eval:
    def disj(props: Props) -> Any:
        lv = left(props)
        if lv is True:
            return True
        rv = right(props)
        if rv is True:
            return True
        if lv is None or rv is None:
            return None
        return False
    return disj


def _unquote(token: Token) -> str:
    return token[1:-1].replace("''", "'")


_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
}


@v_args(inline=True)
class _Compile(Transformer[Token, Node]):
    """Tree → ``Node`` bottom-up; parse-time checks raise ``_CheckError`` at the operator's token."""

    # ---- literals and properties ------------------------------------------------------------------
    def string(self, tok: Token) -> Node:
        return _const(_unquote(tok), CONST, str(tok))

    def number(self, tok: Token) -> Node:
        text = str(tok)
        if any(c in text for c in ".eE"):
            value = float(text)
            if value == float("inf"):
                raise _CheckError(f"{text} is greater than Double.MAX_VALUE", tok)
            if value < DOUBLE_MIN_VALUE:
                raise _CheckError(f"{text} is less than Double.MIN_VALUE (4.9E-324)", tok)
            return _const(value, CONST, text)
        digits = text.rstrip("lL")
        number = int(digits)
        if number > LONG_MAX:
            raise _CheckError(f"{text} is out of the long range", tok)
        return _const(number if INT_MIN <= number <= INT_MAX else JLong(number), CONST, text)

    def true(self, tok: Token) -> Node:
        return _const(True, BOOL_CONST, "TRUE")

    def false(self, tok: Token) -> Node:
        return _const(False, BOOL_CONST, "FALSE")

    def null(self, tok: Token) -> Node:
        return _const(None, BOOL_CONST, "NULL")

    def prop(self, tok: Token) -> Node:
        name = str(tok)
        return Node(PROPERTY, lambda props: props.get(name), text=name)

    # ---- unary ------------------------------------------------------------------------------------
    def pos(self, node: Node) -> Node:
        return node

    def neg(self, node: Node) -> Node:
        inner = node.fn
        return Node(VALUE, lambda props: negate(inner(props)), text=f"-{node.describe()}")

    def not_(self, tok: Token, node: Node) -> Node:
        return Node(BOOLEAN, _not_fn(_as_boolean(node, tok).fn), text=f"NOT {node.describe()}")

    # ---- logic ------------------------------------------------------------------------------------
    def and_(self, left: Node, tok: Token, right: Node) -> Node:
        return Node(BOOLEAN, _and_fn(_as_boolean(left, tok).fn, _as_boolean(right, tok).fn))

    def or_(self, left: Node, tok: Token, right: Node) -> Node:
        return Node(BOOLEAN, _or_fn(_as_boolean(left, tok).fn, _as_boolean(right, tok).fn))

    # ---- equality ---------------------------------------------------------------------------------
    def eq(self, left: Node, tok: Token, right: Node) -> Node:
        _check_equal_operands(left, right, tok)
        return Node(BOOLEAN, _equal_fn(left.fn, right.fn))

    def ne(self, left: Node, tok: Token, right: Node) -> Node:
        _check_equal_operands(left, right, tok)
        return Node(BOOLEAN, _not_fn(_equal_fn(left.fn, right.fn)))

    def is_null(self, left: Node, _is: Token, _null: Token) -> Node:
        inner = left.fn
        return Node(BOOLEAN, lambda props: inner(props) is None)

    def is_not_null(self, left: Node, _is: Token, _not: Token, _null: Token) -> Node:
        inner = left.fn
        return Node(BOOLEAN, lambda props: inner(props) is not None)

    # ---- ordering ---------------------------------------------------------------------------------
    def _order(self, op: str, left: Node, right: Node, tok: Token | None = None) -> Node:
        _check_less_than_operand(left, tok)
        _check_less_than_operand(right, tok)
        return Node(BOOLEAN, _order_fn(left.fn, right.fn, _ORDER_TESTS[op]))

    def gt(self, left: Node, tok: Token, right: Node) -> Node:
        return self._order(">", left, right, tok)

    def ge(self, left: Node, tok: Token, right: Node) -> Node:
        return self._order(">=", left, right, tok)

    def lt(self, left: Node, tok: Token, right: Node) -> Node:
        return self._order("<", left, right, tok)

    def le(self, left: Node, tok: Token, right: Node) -> Node:
        return self._order("<=", left, right, tok)

    def between(self, value: Node, tok: Token, low: Node, _and: Token, high: Node) -> Node:
        if low.kind in (CONST, BOOL_CONST) and high.kind in (CONST, BOOL_CONST):
            if low.value is None or high.value is None:
                raise _CheckError("illegal values of BETWEEN: NULL", tok)
            try:
                ordered = java_compare(high.value, low.value) >= 0
            except EvalError as exc:
                raise _CheckError(f"illegal values of BETWEEN: {exc}", tok) from None
            if not ordered:
                raise _CheckError(f"illegal values of BETWEEN: {low.describe()} is above {high.describe()}", tok)
        ge = self._order(">=", value, low, tok)
        le = self._order("<=", value, high, tok)
        return Node(BOOLEAN, _and_fn(ge.fn, le.fn))

    def not_between(self, value: Node, _not: Token, tok: Token, low: Node, _and: Token, high: Node) -> Node:
        lt = self._order("<", value, low, tok)
        gt = self._order(">", value, high, tok)
        return Node(BOOLEAN, _or_fn(lt.fn, gt.fn))

    # ---- IN and string tests ------------------------------------------------------------------------
    def string_list(self, *toks: Token) -> frozenset[str]:
        return frozenset(_unquote(t) for t in toks)

    def _in(self, value: Node, tok: Token, items: frozenset[str], negated: bool) -> Node:
        if value.kind != PROPERTY:
            raise _CheckError(f"IN needs a property on its left, got {value.describe()}", tok)
        inner = value.fn

        def member(props: Props) -> Any:
            v = inner(props)
            if type(v) is not str:
                return None
            return (v in items) != negated
        return Node(BOOLEAN, member)

    def in_(self, value: Node, tok: Token, items: frozenset[str]) -> Node:
        return self._in(value, tok, items, False)

    def not_in(self, value: Node, _not: Token, tok: Token, items: frozenset[str]) -> Node:
        return self._in(value, tok, items, True)

    def _text_test(self, value: Node, search_tok: Token, test: Callable[[str, str], bool], negated: bool) -> Node:
        search = _unquote(search_tok)
        inner = value.fn

        def check(props: Props) -> Any:
            if not search:
                return False
            v = inner(props)
            if type(v) is not str:
                return False
            return test(v, search) != negated
        return Node(BOOLEAN, check)

    def contains(self, value: Node, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.__contains__, False)

    def not_contains(self, value: Node, _not: Token, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.__contains__, True)

    def startswith(self, value: Node, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.startswith, False)

    def not_startswith(self, value: Node, _not: Token, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.startswith, True)

    def endswith(self, value: Node, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.endswith, False)

    def not_endswith(self, value: Node, _not: Token, _op: Token, s: Token) -> Node:
        return self._text_test(value, s, str.endswith, True)

    def start(self, node: Node) -> Node:
        return _as_boolean(node, None)


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=False)


def _expected(parser: Lark, names: set[str]) -> str:
    shown = []
    for name in sorted(names):
        if name == "$END":
            shown.append("end of input")
            continue
        try:
            term = parser.get_terminal(name)
        except KeyError:
            shown.append(name)
            continue
        shown.append(repr(term.pattern.value) if term.pattern.type == "str" else name)
    return ", ".join(shown)


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based (line, column) of ``text[index]`` (``index == len(text)``: just past the end)."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _syntax_error(parser: Lark, text: str, exc: UnexpectedInput) -> SqlParseError:
    if isinstance(exc, UnexpectedCharacters):
        return SqlParseError(f"syntax error: unexpected character {exc.char!r}", exc.line, exc.column)
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        expected = _expected(parser, set(exc.expected))
        return SqlParseError(f"syntax error: unexpected {str(exc.token)!r}; expected one of {expected}",
                             exc.line, exc.column)
    expected = _expected(parser, set(getattr(exc, "expected", ()) or ()))
    more = f"; expected one of {expected}" if expected else ""
    return SqlParseError(f"syntax error: unexpected end of input{more}", *_position(text, len(text.rstrip())))


class Selector:
    """A compiled SQL92 selector; ``matches(properties)`` for one message."""

    __slots__ = ("text", "_fn")

    def __init__(self, text: str, fn: Eval) -> None:
        self.text = text
        self._fn = fn

    def evaluate(self, properties: Props) -> Any:
        """True / False / None (unknown); raises ``EvalError`` where RocketMQ throws."""
        return self._fn(properties)

    def matches(self, properties: Props) -> bool:
        try:
            return self._fn(properties) is True
        except EvalError:
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def parse_selector(text: str) -> Selector:
    """Parse and check ``text`` (no cache); ``SqlParseError`` with the position of the fault."""
    if len(text) > SELECTOR_CHARS_MAX:
        raise SqlParseError(f"selector is {len(text)} characters, above the limit of {SELECTOR_CHARS_MAX}",
                            *_position(text, SELECTOR_CHARS_MAX))
    if not text.strip():
        raise SqlParseError("selector is empty", 1, 1)
    parser = _parser()
    try:
        tree = parser.parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(parser, text, exc) from None
    try:
        node = _Compile().transform(tree)
    except VisitError as exc:
        cause = exc.orig_exc
        if isinstance(cause, _CheckError):
            tok = cause.token
            if tok is not None and tok.line is not None:
                raise SqlParseError(str(cause), tok.line, tok.column or 0) from None
            raise SqlParseError(str(cause), *_position(text, len(text) - len(text.lstrip()))) from None
        raise
    return Selector(text, node.fn)


@lru_cache(maxsize=COMPILE_CACHE_ENTRIES)
def _compile_cached(text: str) -> Selector | SqlParseError:
    try:
        return parse_selector(text)
    except SqlParseError as exc:
        return exc


def compile_selector(text: str) -> Selector:
    """``parse_selector`` with a cache of the last ``COMPILE_CACHE_ENTRIES`` texts (failures too)."""
    result = _compile_cached(text)
    if isinstance(result, SqlParseError):
        raise result
    return result
