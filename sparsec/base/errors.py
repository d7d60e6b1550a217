"""Errors are values: every failure a user can cause is a `SparsecError` subclass.

An error may carry the source text and a span ``(start, end)`` into it; ``str(err)``
then shows the expression with a caret line under the fault, e.g.::

    unknown character '$'
      y(i) = A(i,j) $ x(j)
                    ^
"""

from __future__ import annotations


class SparsecError(Exception):
    """Base of every error sparsec raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.span = span

    def with_source(self, source: str) -> SparsecError:
        """Attach the expression text (kept if one is already attached)."""
        if self.source is None:
            self.source = source
        return self

    def __str__(self) -> str:
        if self.source is None or self.span is None:
            return self.message
        return f"{self.message}\n{caret_view(self.source, self.span)}"


def caret_view(source: str, span: tuple[int, int]) -> str:
    """The source line holding ``span`` with carets under the spanned characters."""
    start, end = span
    start = max(0, min(start, len(source)))
    end = max(start + 1, min(end, len(source) + 1))
    line_start = source.rfind("\n", 0, start) + 1
    line_end = source.find("\n", start)
    if line_end == -1:
        line_end = len(source)
    line = source[line_start:line_end]
    # Long lines (deep nesting, huge literals) are clipped around the fault.
    offset = start - line_start
    width = max(1, min(end, line_end + 1) - start)
    if len(line) > 100:
        lo = max(0, offset - 40)
        line = ("..." if lo else "") + line[lo : lo + 80] + ("..." if lo + 80 < len(line) else "")
        offset = offset - lo + (3 if lo else 0)
        width = min(width, 80)
    printable = "".join(ch if ch.isprintable() else "?" for ch in line)
    return f"  {printable}\n  {' ' * offset}{'^' * width}"


class ParseError(SparsecError):
    """The expression text is not index notation (syntax)."""


class NotationError(SparsecError):
    """The expression parses but is not meaningful (an index, order or name rule)."""


class FormatError(SparsecError):
    """A format string or object is malformed or does not fit its tensor."""


class ScheduleError(SparsecError):
    """A schedule command is illegal or unsupported for this expression."""


class LoweringError(SparsecError):
    """No kernel can be generated (e.g. no loop order fits every tensor's levels)."""


class InputError(SparsecError):
    """A kernel call got missing, extra or malformed inputs."""


class ShapeError(InputError):
    """Input shapes disagree with the expression or with each other."""


class DTypeError(InputError):
    """An input has an unsupported value or index dtype."""


class StorageError(InputError):
    """A sparse tensor's storage arrays violate an invariant of its level formats."""


class CompileError(SparsecError):
    """The C/CUDA toolchain failed or is missing; carries the compiler's message."""


class StagesMissing(SparsecError):
    """Internal: a kernel built for one extent's register-tile stages was called with an
    extent that needs others (kernel status STAGES_MISSING). `Kernel` answers it by
    building the kernel with every stage and running the call again; it never reaches a
    user."""


class CheckError(SparsecError):
    """A kernel's result differs from the dense torch reference."""


class MachineError(SparsecError):
    """A description of the machine (``SPARSEC_MACHINE``, `sparsec.policy.machine.use`) is
    malformed."""


__all__ = [
    "SparsecError",
    "ParseError",
    "NotationError",
    "FormatError",
    "ScheduleError",
    "LoweringError",
    "InputError",
    "ShapeError",
    "DTypeError",
    "StorageError",
    "CompileError",
    "CheckError",
    "MachineError",
    "caret_view",
]
