"""The value dtypes a kernel can compute in: the 16-bit types C kernels can store on this
machine, asked by code generation and by each call (`sparsec.runtime.inputs`), since
generated code and compiled kernels are cached across machines' facts; and what a
statement may say in an integral type (`check_kernel_type`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..base.errors import DTypeError
from ..base.values import is_integral, value_type
from ..frontend.concrete import Statement, Sum, children, index_counts
from ..frontend.notation import Access, Assignment, BinOp, Call, Literal, Neg
from ..frontend.semirings import semiring
from ..middle.spec import Spec
from ..tensors.halves import HALF
from .compiler import C_HALF_TYPES
from .machine import c_half_types


def check_c_dtype(dtype: str) -> None:
    """A `DTypeError` where C kernels cannot store ``dtype`` (a 16-bit type the compiler
    lacks, `machine.c_half_types`)."""
    if dtype in HALF and dtype not in c_half_types():
        raise DTypeError(
            f"{dtype} values on the C target need a C compiler with a {dtype} type "
            f"({C_HALF_TYPES[dtype]} with conversions, as in recent GCC and Clang; this "
            f"one has {' and '.join(sorted(c_half_types())) or 'neither'}): cast the inputs "
            "to float32, pass dtype='float32', or use target='cuda-emulated'"
        )


#: the functions an integral kernel computes in its own type (the others are floating)
INTEGRAL_FUNCTIONS = ("abs", "max", "min", "relu", "sign")


def check_kernel_type(spec: Spec, dtype: str) -> None:
    """What ``spec``'s statement cannot mean in ``dtype``, refused (`check_value_type`,
    `check_lifted_sums`): where a kernel is made with a type, and where code is generated
    for one."""
    check_value_type(spec.assignment, dtype)
    multiply = semiring(spec.semantics.semiring).multiply
    check_lifted_sums(spec.statement, dtype, multiply, spec.patterns)


def check_value_type(assignment: Assignment, dtype: str) -> None:
    """A `DTypeError` where ``assignment`` has no meaning in the integral type ``dtype``
    (docs/semantics.md, "Value types"): a function computed in floating point, a literal
    that is not a value of the type, and for bool a ``-`` or ``/`` (numpy refuses a bool
    subtraction; ``+`` is or and ``*`` is and)."""
    if not is_integral(dtype):
        return
    hint = "pass dtype='float64' (or inputs of a floating type) to compute in floating point"
    for node in _concrete_nodes(assignment.rhs):
        match node:
            case Call(fn=fn) if fn not in INTEGRAL_FUNCTIONS:
                raise DTypeError(
                    f"{fn}(...) computes in floating point, and this kernel's values are "
                    f"{dtype}, whose functions are {', '.join(INTEGRAL_FUNCTIONS)}: {hint}"
                )
            case Literal(value=v) if not _holds(dtype, v):
                raise DTypeError(f"the literal {v!r} is not a value of {dtype}: {hint}")
            case Neg() | BinOp(op="-" | "/") if dtype == "bool":
                what = "negation" if isinstance(node, Neg) else f"'{node.op}'"
                raise DTypeError(
                    f"{what} has no meaning on bool values ('+' is or, '*' is and): cast the "
                    "inputs to an integer type or pass dtype='int64'"
                )


def check_lifted_sums(
    statement: Statement, dtype: str, multiply: str = "*", masks: frozenset[str] = frozenset()
) -> None:
    """A `DTypeError` where, in an integral type, a sum was moved (docs/semantics.md,
    Reductions) across what does not distribute over it in wrapping or truncating
    arithmetic: a division by a literal (``1/2 + 1/2`` is 0, ``(1 + 1)/2`` is 1), or a
    factor of a semiring whose multiply is ``+`` (``max(a, b) + c`` is not ``max(a + c, b
    + c)`` once a sum wraps). Exact for real numbers, so float kernels are unaffected.
    ``masks``: the statement's mask patterns, which a sum may cross."""
    if not is_integral(dtype):
        return
    sums = [(statement.top_sums, statement.rhs)]
    sums += [(x.indices, x.body) for x in _concrete_nodes(statement.rhs) if isinstance(x, Sum)]
    for indices, body in sums:
        if not indices:
            continue
        for node in _concrete_nodes(body):
            if not (isinstance(node, BinOp) and node.op == "/" and isinstance(node.right, Literal)):
                continue
            inside = _uses(node.left)
            moved = [i for i in indices if inside[i] and inside[i] == _uses(body)[i]]
            if moved:
                raise DTypeError(
                    f"this {dtype} kernel would divide each term of the sum over "
                    f"{', '.join(moved)} by {node.right.value!r} (the sum is moved across a "
                    "division by a literal, exact for real numbers only: integer division "
                    "truncates each term): divide the result after the call, or pass "
                    "dtype='float64'"
                )
        crossed = [c for i in indices if (c := _crossed(body, i)) is not None]
        # a mask only filters (`spec.patterns`): a sum crossing it changes no value
        crossed = [c for c in crossed if not (isinstance(c, Access) and c.name in masks)]
        if multiply == "+" and crossed:
            raise DTypeError(
                f"this {dtype} kernel would add {crossed[0]} to each term of the sum over "
                f"{', '.join(indices)} (the sum is moved across a product whose multiply is "
                "+, exact for real numbers only: a wrapping sum changes the min or max): "
                "pass dtype='float64', or a wider integer type"
            )


def _crossed(body: Any, index: str) -> Any:
    """The factor a sum over ``index`` at ``body`` was moved across: where the body is a
    product (through unary minus) whose uses of ``index`` all lie in one operand, the sum's
    place is inside that operand, so it crossed the other; None where it was placed here."""
    match body:
        case Neg(operand=x):
            return _crossed(x, index)
        case BinOp(op="*", left=left, right=right):
            in_left, in_right = _uses(left)[index] > 0, _uses(right)[index] > 0
            if in_left and in_right:
                return None
            return right if in_left else left
        case _:
            return None


def _uses(expr: Any) -> Counter[str]:
    return index_counts(expr)


def _concrete_nodes(expr: Any) -> Iterator[Any]:
    """``expr`` and every subexpression (notation or concrete: the same node classes)."""
    yield expr
    for child in children(expr):
        yield from _concrete_nodes(child)


def _holds(dtype: str, v: float) -> bool:
    vt = value_type(dtype)
    return float(v).is_integer() and vt.low <= v <= vt.high
