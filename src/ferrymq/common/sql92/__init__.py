"""RocketMQ-compatible SQL92 message selectors (``MessageSelector.bySql``), evaluated on properties.

    sel = compile_selector("a BETWEEN 1 AND 3 AND TAGS IN ('TagA', 'TagB')")
    sel.matches({"a": "2", "TAGS": "TagA"})  # True
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ferrymq.common.sql92.compiler import (
        COMPILE_CACHE_ENTRIES,
        SELECTOR_CHARS_MAX,
        Selector,
        SqlParseError,
        compile_selector,
        parse_selector,
    )
    from ferrymq.common.sql92.values import EvalError, JLong

#: Names loaded on first use: the compiler loads lark and builds its grammar (~0.1 s), which a process that
#: only needs the constants below (a client subscribing by tag, a Spark driver) should not pay.
_LAZY = {
    "COMPILE_CACHE_ENTRIES": "compiler", "SELECTOR_CHARS_MAX": "compiler", "Selector": "compiler",
    "SqlParseError": "compiler", "compile_selector": "compiler", "parse_selector": "compiler",
    "EvalError": "values", "JLong": "values",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

#: the expression types of a subscription (SubscriptionData.expressionType)
EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"


def is_tag_type(expression_type: str | None) -> bool:
    """RocketMQ's ``ExpressionType.isTagType``: null, empty or TAG (any case)."""
    return not expression_type or expression_type.upper() == EXPRESSION_TYPE_TAG


__all__ = [
    "COMPILE_CACHE_ENTRIES", "EXPRESSION_TYPE_SQL92", "EXPRESSION_TYPE_TAG", "SELECTOR_CHARS_MAX", "EvalError",
    "JLong", "Selector", "SqlParseError", "compile_selector", "is_tag_type", "parse_selector",
]
