"""Frontend: index-notation text -> checked `Assignment` AST.

The grammar (``grammar/index_notation.lark``) is the language reference. This module

* ``parse(text)``: syntax only. Builds the AST with spans ``(start, end)`` into ``text``.
* ``check(assignment, source)``: the index-notation rules (below); returns the
  assignment unchanged or raises.
* ``parse_expression(text)``: both; the entry point the rest of the compiler calls.

Every failure is a `ParseError` (syntax) or `NotationError` (meaning) carrying the
source and a span, so ``str(err)`` shows the expression with a caret under the fault.
No lark exception, `RecursionError` or other traceback escapes for any string input.

Robustness limits are checked before lark runs: at most `MAX_LENGTH` characters, only
characters of the language, balanced parentheses nested at most `MAX_DEPTH` deep. The
AST itself may be at most `MAX_DEPTH` nodes deep, since every later stage (printer,
lowering) walks it recursively.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import assert_never

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedInput

from ..base.errors import NotationError, ParseError
from ..base.resources import cache_dir, data_dir, read_entry, write_entry
from .functions import FUNCTIONS, function
from .notation import Access, Assignment, BinOp, Call, Expr, Literal, Neg, Span, indices_of
from .syntax import clip, end, start, syntax_error, token_span, unknown_function, where

MAX_LENGTH = 100_000
MAX_DEPTH = 256

_GRAMMAR_NAME = "index_notation.lark"

_UNKNOWN_CHARACTER = re.compile(r"[^A-Za-z0-9_()+\-*/=,. \t\r\n]")
_PARENTHESIS = re.compile(r"[()]")

# --- the Lark instance -------------------------------------------------------------------


@v_args(inline=True)
class _BuildAst(Transformer[Token, object]):
    """Builds AST nodes from tokens during the LALR parse; nothing else.

    Runs inline (as the parser's callbacks), so arbitrarily long operator chains never
    recurse. Spans come from the tokens: a node covers its own text, including any
    parentheses written around it.
    """

    def assignment(self, lhs: Access, op: Token, rhs: Expr) -> Assignment:
        accumulate = op.type == "PLUS_ASSIGN"
        return Assignment(lhs, rhs, accumulate, span=(lhs.span[0], rhs.span[1]))

    def binop(self, left: Expr, op: Token, right: Expr) -> BinOp:
        return BinOp(str(op), left, right, span=(left.span[0], right.span[1]))

    def neg(self, minus: Token, operand: Expr) -> Neg:
        return Neg(operand, span=(start(minus), operand.span[1]))

    def literal(self, number: Token) -> Literal:
        # float() of a NUMBER never fails; it gives inf on overflow, rejected after the parse.
        return Literal(float(number), span=token_span(number))

    def call(self, name: Token, lpar: Token, *rest: Expr | Token) -> Call:
        args = tuple(arg for arg in rest if not isinstance(arg, Token))
        return Call(str(name), args, span=(start(name), end(rest[-1])))  # type: ignore[arg-type]

    def paren(self, lpar: Token, inner: Expr, rpar: Token) -> Expr:
        return replace(inner, span=(start(lpar), end(rpar)))

    def access(self, name: Token, *rest: Token) -> Access:
        indices = tuple(token for token in rest if token.type == "NAME")
        return Access(
            str(name),
            tuple(str(index) for index in indices),
            span=(start(name), end(rest[-1] if rest else name)),
            index_spans=tuple(token_span(index) for index in indices),
        )

    def start(self, assignment: Assignment) -> Assignment:
        return assignment


#: options a parser takes when made, not kept with its tables (lark's own cache's choice)
_PER_PROCESS_OPTIONS = (
    "postlex",
    "transformer",
    "lexer_callbacks",
    "use_bytes",
    "debug",
    "g_regex_flags",
    "regex",
    "propagate_positions",
    "tree_class",
    "_plugins",
)


@functools.cache
def _lark(fresh: bool = False) -> Lark:
    """The grammar compiled once per process (a race may build it twice; both are equal).

    Its LALR tables are a function of the grammar, lark's version and Python's alone, so
    they are kept in the cache directory (`_tables`): analysing the grammar is a large part
    of the first kernel of every process, loading the tables a small one (docs/decisions.md,
    "A cold compile's time"). The entry is written
    whole (`resources.write_entry`: lark's own ``cache=`` writes in place, and two
    processes writing at once left a file that unpickled into tables naming rules that
    were not there), and anything wrong with it, on loading or in the first parses
    (`_run_lark`), makes a parser built from the grammar (``fresh``) instead."""
    text = (data_dir("grammar") / _GRAMMAR_NAME).read_text(encoding="utf-8")
    path = _tables(text)
    if path is not None and not fresh:
        payload = read_entry(path)
        if payload is not None:
            try:
                # what lark's own cache does on a hit (`Lark.load` takes no transformer)
                loaded: Lark = Lark.__new__(Lark)._load(
                    io.BytesIO(payload), transformer=_BuildAst(), propagate_positions=True
                )
                return loaded
            except Exception:  # noqa: BLE001 - damaged or foreign tables: rebuilt below
                pass
    parser = Lark(
        text,
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        transformer=_BuildAst(),
    )
    if path is not None:
        buffer = io.BytesIO()
        parser.save(buffer, exclude_options=_PER_PROCESS_OPTIONS)
        write_entry(path, buffer.getvalue())
    return parser


def _tables(text: str) -> Path | None:
    """The cache file of the parser's tables (named by a digest of what they derive from),
    or None when the cache directory cannot be made."""
    import lark

    digest = hashlib.sha256(
        "\0".join((text, lark.__version__, sys.version, "lalr contextual")).encode()
    ).hexdigest()[:24]
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory / f"grammar-{digest}.lark"


# --- public API --------------------------------------------------------------------------


def parse(text: str) -> Assignment:
    """Parse one index-notation statement into an `Assignment` (syntax only, no `check`).

    Raises `ParseError` for malformed text and `NotationError` for a literal that is not
    a finite double; both carry ``source=text`` and the span of the fault.
    """
    if not isinstance(text, str):
        raise ParseError(f"expected the expression as a string, not {type(text).__name__}")
    _prescan(text)
    try:
        assignment = _run_lark(text)
    except RecursionError:
        raise ParseError("expression nests too deeply", source=text, span=(0, 1)) from None
    _check_tree(assignment, text)
    return assignment


def check(assignment: Assignment, source: str | None = None) -> Assignment:
    """Apply the index-notation rules; return ``assignment`` unchanged or raise `NotationError`.

    Rules, each reported at the span of the offending access or index variable:

    * an index variable appears at most once in one access (no diagonals ``B(i,i)``);
    * a name keeps one order everywhere, left-hand side included (a scalar has order 0);
    * the output is not read on the right-hand side (neither with ``=`` nor ``+=``);
    * every left-hand index variable appears on the right-hand side.
    """
    try:
        _check_accesses(assignment, source)
    except RecursionError:
        raise NotationError(
            "expression nests too deeply", source=source, span=assignment.span
        ) from None
    _check_free_indices(assignment, source)
    return assignment


def parse_expression(text: str) -> Assignment:
    """`parse` then `check`: the frontend as the rest of the compiler uses it."""
    return check(parse(text), text)


# --- before lark: length, alphabet, parentheses -------------------------------------------


def _prescan(text: str) -> None:
    """Reject what lark should never see: huge input, foreign characters, bad nesting."""
    if len(text) > MAX_LENGTH:
        raise ParseError(
            f"expression is too long: {len(text)} characters (the limit is {MAX_LENGTH})",
            source=text,
            span=(MAX_LENGTH, MAX_LENGTH + 1),
        )
    if (bad := _UNKNOWN_CHARACTER.search(text)) is not None:
        raise ParseError(
            f"unknown character {_show_character(bad.group())}",
            source=text,
            span=(bad.start(), bad.end()),
        )
    if not text.strip():
        raise ParseError("empty expression", source=text, span=(0, 1))
    open_positions: list[int] = []
    for match in _PARENTHESIS.finditer(text):
        pos = match.start()
        if match.group() == "(":
            open_positions.append(pos)
            if len(open_positions) > MAX_DEPTH:
                raise ParseError(
                    f"parentheses nest too deeply (more than {MAX_DEPTH} levels)",
                    source=text,
                    span=(pos, pos + 1),
                )
        elif open_positions:
            open_positions.pop()
        else:
            raise ParseError(
                f"unbalanced parentheses: ')' at {where(text, pos)} has no matching '('",
                source=text,
                span=(pos, pos + 1),
            )
    if open_positions:
        pos = open_positions[-1]
        raise ParseError(
            f"unbalanced parentheses: '(' at {where(text, pos)} is never closed",
            source=text,
            span=(pos, pos + 1),
        )


def _show_character(ch: str) -> str:
    shown = repr(ch)
    return shown if ch.isascii() else f"{shown} (U+{ord(ch):04X})"


# --- lark and its errors -----------------------------------------------------------------


def _run_lark(text: str) -> Assignment:
    """Parse with the process's parser; a failure inside lark or the AST builder (not a
    syntax error: tables that do not fit the grammar) rebuilds the parser from the grammar
    and parses again, and only a failure of that one is an error (a `ParseError`)."""
    global _distrusted
    if not _distrusted:
        try:
            return _parse_with(_lark(), text)
        except _Internal:
            _distrusted = True
    try:
        return _parse_with(_lark(fresh=True), text)
    except _Internal as internal:
        raise ParseError(
            f"cannot parse the expression (the parser failed: {internal})", source=text
        ) from None


#: the parser from the cached tables failed once: this process parses with a fresh one
_distrusted = False


class _Internal(Exception):
    """A failure of the parser itself (never of the text)."""


def _parse_with(parser: Lark, text: str) -> Assignment:
    """Parse token by token, remembering the last tokens so errors can say 'after ...'."""
    seen: list[Token] = []  # the last two tokens from the lexer, most recent last
    try:
        interactive = parser.parse_interactive(text)
        for token in interactive.iter_parse():
            seen = [*seen[-1:], token]
        result = interactive.feed_eof(seen[-1] if seen else None)
    except UnexpectedInput as error:
        unknown_function(text, error)
        # LALR merges states (an access on the left and on the right share one), so
        # ``error.expected`` may list terminals that cannot follow; ask the parser instead.
        expected = frozenset(interactive.accepts())
        raise syntax_error(text, error, expected, seen) from None
    except (ParseError, NotationError, RecursionError):
        raise
    except Exception as error:  # noqa: BLE001 - lark's or the builder's own fault
        raise _Internal(f"{type(error).__name__}: {error}") from None
    if not isinstance(result, Assignment):
        raise _Internal(f"built {type(result).__name__}, not an assignment")
    return result


# --- after lark: depth and literal range -------------------------------------------------


def _check_tree(assignment: Assignment, text: str) -> None:
    """Bound the AST depth and require finite literals, without recursion."""
    stack: list[tuple[Expr, int]] = [(assignment.rhs, 1)]
    while stack:
        expr, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ParseError(
                f"expression nests too deeply (more than {MAX_DEPTH} levels of operators)",
                source=text,
                span=(expr.span[0], expr.span[0] + 1),
            )
        match expr:
            case Access():
                pass
            case Literal(value=value) if not math.isfinite(value):
                written = clip(text[expr.span[0] : expr.span[1]])
                raise NotationError(
                    f"numeric literal {written} is out of range (the limit is about 1.8e308)",
                    source=text,
                    span=expr.span,
                )
            case Literal():
                pass
            case Neg(operand=operand):
                stack.append((operand, depth + 1))
            case BinOp(left=left, right=right):
                stack.extend(((right, depth + 1), (left, depth + 1)))
            case Call(fn=fn, args=args):
                known = function(fn, expr.span, text)
                if len(args) != known.arity:
                    raise NotationError(
                        f"{fn} takes {known.arity} argument{'s' if known.arity > 1 else ''}, "
                        f"not {len(args)}",
                        source=text,
                        span=expr.span,
                    )
                stack.extend((arg, depth + 1) for arg in reversed(args))
            case _:
                assert_never(expr)


# --- semantic rules ----------------------------------------------------------------------


def _check_accesses(assignment: Assignment, source: str | None) -> None:
    """Per access, in source order: repeated indices, one order per name, output not read,
    no tensor named after a function."""
    first_use: dict[str, Access] = {}
    output = assignment.lhs
    for number, access in enumerate(assignment.accesses()):
        if access.name in FUNCTIONS:
            raise NotationError(
                f"'{access.name}' is a function name, reserved; name the tensor otherwise"
                f" (the functions are {', '.join(FUNCTIONS)})",
                source=source,
                span=access.span,
            )
        # a read may repeat an index (A(i,i): the diagonal, an equality filter on the
        # stored coordinates, sparsec.middle.derive); the output's modes stay distinct
        for position, index in enumerate(access.indices if number == 0 else ()):
            if index in access.indices[:position]:
                raise NotationError(
                    f"index variable '{index}' appears twice in {access}, the output; "
                    "an output must use distinct index variables (a repeated index reads "
                    "a diagonal on the right-hand side only)",
                    source=source,
                    span=_index_span(access, position),
                )
        earlier = first_use.setdefault(access.name, access)
        if earlier.order != access.order:
            raise NotationError(
                f"'{access.name}' is used as {_kind(access.order)} here but as "
                f"{_kind(earlier.order)} at {where(source, earlier.span[0])}",
                source=source,
                span=access.span,
            )
        if number > 0 and access.name == output.name:
            advice = (
                "'+=' already adds the right-hand side to it"
                if assignment.accumulate
                else f"use += to accumulate into it ({output} += <the other terms>, called "
                f"with its current value as {output.name}=...; dense or sparse)"
            )
            raise NotationError(
                f"the output '{output.name}' cannot be read on the right-hand side; {advice}",
                source=source,
                span=access.span,
            )


def _check_free_indices(assignment: Assignment, source: str | None) -> None:
    """Every left-hand index variable must be bound by the right-hand side."""
    used = indices_of(assignment.rhs)
    for position, index in enumerate(assignment.lhs.indices):
        if index not in used:
            raise NotationError(
                f"index variable '{index}' of the output does not appear on the right-hand side",
                source=source,
                span=_index_span(assignment.lhs, position),
            )


def _kind(order: int) -> str:
    return "a scalar" if order == 0 else f"an order-{order} tensor"


def _index_span(access: Access, position: int) -> Span:
    if position < len(access.index_spans):
        return access.index_spans[position]
    return access.span


__all__ = ["MAX_DEPTH", "MAX_LENGTH", "check", "parse", "parse_expression"]
