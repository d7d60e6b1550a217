"""The parser's error messages: what lark found at a fault, what it expected there, and
the unknown function a call-like access names (`sparsec.frontend.parser` raises them).

A fault is named by its token and the parser's expectation in the user's words (an
operand, an index variable), never lark's terminal names.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..base.errors import ParseError
from .functions import FUNCTIONS, function
from .notation import Span

#: lark terminal name -> how an error message names it
TERMINAL_NAMES = {
    "NAME": "a name",
    "FUNCTION": "a function",
    "NUMBER": "a number",
    "PLUS_ASSIGN": "'+='",
    "ASSIGN": "'='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "$END": "the end of the expression",
}
_TERMINAL_ORDER = tuple(TERMINAL_NAMES)

#: (does this rule describe the parser's expectation?, phrase); the first match wins.
#: Arguments: the expected terminal names and the token before the fault (None at the start).
_EXPECTATIONS: tuple[tuple[Callable[[frozenset[str], Token | None], bool], str], ...] = (
    (lambda expected, prev: prev is None, "the output, as in 'y(i) = ...' or 'a = ...'"),
    (
        lambda expected, prev: prev is not None and prev.type == "FUNCTION",
        "'(' after {prev}, a function (function names are reserved)",
    ),
    (lambda expected, prev: "NUMBER" in expected, "an operand after {prev}"),
    (lambda expected, prev: "ASSIGN" in expected, "'=' or '+=' after the left-hand side"),
    (lambda expected, prev: expected == {"NAME"}, "an index variable after {prev}"),
    (lambda expected, prev: "NAME" in expected, "an index variable or ')' after {prev}"),
    (lambda expected, prev: "COMMA" in expected, "',' or ')' in the index list"),
)


_CALLEE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*$")


def unknown_function(text: str, error: UnexpectedInput) -> None:
    """``foo(A(i,j))``: an expression inside the parentheses of a name that is no
    function. The parser reads ``foo(`` as an access, so the fault is an operand where an
    index variable belongs; say that ``foo`` is not a function instead."""
    if not isinstance(error, UnexpectedToken):
        return
    if error.token.type not in ("LPAR", "PLUS", "MINUS", "STAR", "SLASH"):
        return
    pos, depth = start(error.token), 0
    before = text[:pos].rstrip()
    if not before or not (before[-1].isalnum() or before[-1] == "_"):
        return  # not after an index variable: ``A((i))`` is a plain syntax error
    for at in range(pos - 1, -1, -1):
        if text[at] == ")":
            depth += 1
        elif text[at] == "(":
            if depth == 0:
                callee = _CALLEE.search(text, 0, at)
                if callee is not None and callee.group(1) not in FUNCTIONS:
                    function(callee.group(1), callee.span(1), text)
                return
            depth -= 1


def syntax_error(
    text: str, error: UnexpectedInput, expected: frozenset[str], seen: list[Token]
) -> ParseError:
    """A `ParseError` naming what was found at the fault and what the parser accepts there."""
    match error:
        case UnexpectedToken(token=token) if token.type != "$END":
            pos, span, found = start(token), token_span(token), _describe_token(token)
        case UnexpectedCharacters():
            pos = error.pos_in_stream or 0  # typed Optional; always set by the lexer
            span, found = (pos, pos + 1), f"character {text[pos]!r}"
        case UnexpectedToken() | UnexpectedEOF():
            end = len(text.rstrip())
            expectation = _expectation(expected, seen[-1] if seen else None)
            return ParseError(
                f"expression ends early; expected {expectation}", source=text, span=(end, end + 1)
            )
        case _:
            raise AssertionError(f"unhandled lark error {type(error).__name__}")
    prev = next((token for token in reversed(seen) if start(token) < pos), None)
    return ParseError(
        f"unexpected {found}; expected {_expectation(expected, prev)}", source=text, span=span
    )


def _expectation(expected: frozenset[str], prev: Token | None) -> str:
    for applies, phrase in _EXPECTATIONS:
        if applies(expected, prev):
            return phrase.format(prev=_describe_token(prev) if prev is not None else "")
    names = [TERMINAL_NAMES[t] for t in _TERMINAL_ORDER if t in expected]
    names += sorted(t for t in expected if t not in TERMINAL_NAMES)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _describe_token(token: Token) -> str:
    text = clip(str(token))
    match token.type:
        case "NAME":
            return f"name '{text}'"
        case "NUMBER":
            return f"number {text}"
        case "$END":
            return TERMINAL_NAMES["$END"]
        case _:
            return f"'{text}'"


# --- small helpers -----------------------------------------------------------------------


def where(source: str | None, pos: int) -> str:
    """'column N' (1-based), or 'line L, column N' in multi-line text."""
    if source is None or "\n" not in source:
        return f"column {pos + 1}"
    line = source.count("\n", 0, pos) + 1
    column = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}"


def clip(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


def start(token: Token) -> int:
    return token.start_pos or 0


def end(token: Token) -> int:
    return token.end_pos or 0


def token_span(token: Token) -> Span:
    return (start(token), end(token))
