"""`sparsec.Tensor`'s operators, each one statement in index notation run by a kernel.

Registered with `sparsec.tensors.ops` when `sparsec` is imported (the `Tensor` class sits
stages below the kernels and reaches them only through that registry). Every operator is
spelled as an index-notation statement over generated names (``A``, ``B``, ``O``; modes
``i0 i1 ...``, the contraction ``k``) with the operands' own formats, and runs through
`kernel`, whose memo keys the compiled kernel by statement, formats and options (the value
and index dtypes pick the executable inside it): a repeated ``T @ x`` costs a lookup and the
call's fast path. Nothing densifies a sparse operand; a sparse result is assembled by the
kernel in the format stated below.

==========================  =========================================  ==================
operator                    statement                                  result
==========================  =========================================  ==================
``T @ x``, ``x @ T``        ``O(i,j) = A(i,k) * B(k,j)`` (orders 1-2)   dense (x's kind)
``T @ S``                   the same, both sparse                      CSR (CSC if both
                                                                       column-major)
``T + S``, ``T - S``        ``O(i..) = A(i..) +- B(i..)``: the union   T's format
``T + x``, ``x - T``        the same with a dense operand              dense (x's kind)
``T * c``, ``T / c``, -T    ``O(i..) = s * A(i..)``: T's pattern,      T's format
                            stored zeros kept
``T * S``, ``T * x``        ``O(i..) = A(i..) * B(i..)``: intersection T's format
``T.sum(axis)``             ``O(kept) = A(i..)``: the lost modes       dense (a scalar
                            summed                                     for axis=None)
``T.T``                     no kernel: the reversed mode ordering      T's levels
==========================  =========================================  ==================

A dense operand of lower order is matched against T's trailing modes (numpy's broadcasting
without its size-1 stretching). Values follow the kernels' one rule (docs/semantics.md,
Value types: torch's promotion over the floating operands; an integer array takes no
part), and a number (Python or numpy scalar, 0-d array) keeps T's dtype, as a torch
scalar does. ``T @ S`` runs Gustavson's row order,
a column-major operand of a mixed pair re-laid out once (`Tensor.derived`). numpy's entry points
reach these operators (``np.matmul``/``np.dot``/``np.add``/... and numpy's own operators
through ``__array_ufunc__``/``__array_function__``) or are refused with an `InputError`
naming the sparse spelling (``np.exp(T)``, ``np.concatenate``, ``np.allclose``). A scipy
matrix on the left of ``@`` would densify T (scipy calls ``np.asanyarray`` on an operand it
does not know): that conversion is refused, saying to write ``sparsec.as_tensor(a) @ T``.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..base.errors import DTypeError, InputError, ShapeError
from ..policy.machine import machine
from ..tensors import ops
from ..tensors.formats import Format, parse_format
from ..tensors.mapped import MappedTensor
from ..tensors.maps import parse_mapped
from ..tensors.stored import Stored, stored
from ..tensors.tensor import Tensor, as_tensor
from .kernel import kernel

#: the share of the machine's memory a dense conversion may take
DENSE_SHARE = 0.5


# --------------------------------------------------------------------------- operands


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a torch operand imported it
    return torch is not None and isinstance(x, torch.Tensor)


def sparse_operand(x: Any) -> Any:
    """``x`` as a sparse operand (a Tensor or MappedTensor, scipy or torch sparse in its
    own format), or None."""
    if isinstance(x, Tensor | MappedTensor):
        return x
    if type(x).__module__.startswith("scipy.sparse"):
        return as_tensor(x)
    if _torch_tensor(x) and x.layout != sys.modules["torch"].strided:
        return as_tensor(x)
    return None


def scalar_operand(x: Any) -> float | None:
    if isinstance(x, numbers.Number) and not isinstance(x, numbers.Real):
        raise DTypeError(f"complex scalar {x!r}: sparsec values are float32 or float64")
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return scalar_operand(x.item())
    return None


def dense_operand(x: Any) -> Any:
    """``x`` itself when it is a dense operand (numpy or strided torch), None for anything
    else. Its values are not cast here: the kernel's binding promotes every call's inputs
    by one rule (`sparsec.runtime.binding.common_dtype`: torch's, integers take no part)."""
    if isinstance(x, np.ndarray):
        kind = x.dtype.kind
    elif _torch_tensor(x) and x.layout == sys.modules["torch"].strided:
        kind = "c" if x.dtype.is_complex else "f"
    else:
        return None
    if kind == "c":
        raise DTypeError(f"complex operand ({x.dtype}): sparsec values are real")
    return x


def _modes(order: int, start: int = 0) -> list[str]:
    return [f"i{m}" for m in range(start, start + order)]


def _access(name: str, indices: Sequence[str]) -> str:
    return f"{name}({','.join(indices)})" if indices else name


def _run(expr: str, formats: dict[str, Any], out: Any, **inputs: Any) -> Any:
    """Run ``expr`` (its output named ``O``) through the kernel memo; ``out``: the sparse
    result's format (an all-dense one comes back as a Tensor too)."""
    if out is not None:
        formats = {**formats, "O": out}
    result = kernel(expr, formats)(**inputs)
    if out is not None and out.is_dense and not isinstance(result, Tensor):
        return as_tensor(np.asarray(result), out)
    return result


def _same_shape(op: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ShapeError(
            f"{op}: the sparse operands' shapes {a.shape} and {b.shape} differ (sparse "
            "operands are not broadcast)"
        )


def _trailing(op: str, t: Tensor, shape: tuple[int, ...]) -> list[str]:
    """The indices of a dense operand of ``shape`` matched to ``t``'s trailing modes."""
    if len(shape) > t.order or tuple(shape) != t.shape[t.order - len(shape) :]:
        raise ShapeError(
            f"{op}: a dense operand of shape {tuple(shape)} does not match the sparse "
            f"tensor's shape {t.shape}: it must equal its trailing extents (size-1 modes "
            "are not stretched)"
        )
    return _modes(len(shape), t.order - len(shape))


# --------------------------------------------------------------------------- operators


def _matmul(left: Any, right: Any) -> Any:
    a, b = sparse_operand(left), sparse_operand(right)
    if a is None and b is None:
        return NotImplemented
    da = left if a is not None else dense_operand(left)
    db = right if b is not None else dense_operand(right)
    if da is None or db is None:
        return NotImplemented
    sa, sb = (
        tuple(a.shape if a is not None else da.shape),
        tuple(b.shape if b is not None else db.shape),
    )
    if not (1 <= len(sa) <= 2 and 1 <= len(sb) <= 2):
        raise ShapeError(
            f"matmul: operands of orders {len(sa)} and {len(sb)}; `@` takes vectors and "
            "matrices (write higher orders with sparsec.einsum or sparsec.kernel)"
        )
    if sa[-1] != sb[0]:
        raise ShapeError(
            f"matmul: shapes {sa} and {sb} do not agree: {sa[-1]} columns against {sb[0]} rows"
        )
    ia = ["i", "k"] if len(sa) == 2 else ["k"]
    ib = ["k", "j"] if len(sb) == 2 else ["k"]
    lhs = [v for v in (*ia, *ib) if v != "k"]
    expr = f"{_access('O', lhs)} = {_access('A', ia)} * {_access('B', ib)}"
    formats = {n: t.format for n, t in (("A", a), ("B", b)) if t is not None}
    out = None
    if isinstance(a, MappedTensor) or isinstance(b, MappedTensor):
        if a is not None and b is not None:
            out = _blocked_product(a, b)
        return _run(expr, formats, out, A=a if a is not None else da, B=b if b is not None else db)
    if a is not None and b is not None:
        # Gustavson's order (rows of A scale rows of B into a row workspace) needs both in
        # one major order: column-major pairs run by columns, anything else by rows, a
        # column-major operand re-laid out once (kept on the tensor, stored zeros too)
        column_major = all(t.order == 2 and t.format.ordering == (1, 0) for t in (a, b))
        if not column_major:
            a, b = _row_major(a, ia), _row_major(b, ib)
            formats = {"A": a.format, "B": b.format}
        out = parse_format("csc" if column_major else "csr", 2) if len(lhs) == 2 else None
        out = out or (parse_format("s", 1) if lhs else None)
    return _run(expr, formats, out, A=a if a is not None else da, B=b if b is not None else db)


def _blocked_product(a: Any, b: Any) -> Any:
    """The format of the product of two sparse matrices where one is mapped: bsr(R,C) of
    a bsr(R,K) and a bsr(K,C); any other pair is refused."""
    ba = a.blocksize() if isinstance(a, MappedTensor) else None
    bb = b.blocksize() if isinstance(b, MappedTensor) else None
    if ba is None or bb is None or ba[1] != bb[0]:
        raise InputError(
            f"matmul of {a.format} and {b.format}: a mapped operand's product with another "
            "sparse matrix runs for bsr(R,K) @ bsr(K,C) (a bsr(R,C) result); convert one "
            "operand (T.to_format(...)) or write the statement with sparsec.kernel"
        )
    return parse_mapped(f"bsr({ba[0]},{bb[1]})", 2)


def _row_major(t: Tensor, indices: list[str]) -> Tensor:
    """``t`` with its modes stored in order (CSR for a CSC matrix), as `Tensor.derived`
    re-lays it out: once per tensor, every stored entry kept."""
    if t.format.ordering == tuple(range(t.order)):
        return t
    return t.derived(tuple(indices), Format(t.format.levels, tuple(range(t.order))))


def _elementwise(op: str, left: Any, right: Any) -> Any:
    """``left op right`` for op in add, sub, mul, truediv; one side is a Tensor."""
    symbol = {"add": "+", "sub": "-", "mul": "*", "truediv": "/"}[op]
    a, b = sparse_operand(left), sparse_operand(right)
    if a is not None and b is not None:
        if op == "truediv":
            return NotImplemented
        _same_shape(symbol, a, b)
        idx = _modes(a.order)
        expr = f"{_access('O', idx)} = {_access('A', idx)} {symbol} {_access('B', idx)}"
        return _run(expr, {"A": a.format, "B": b.format}, a.format, A=a, B=b)
    t = a if a is not None else b
    assert t is not None
    other = right if a is not None else left
    idx = _modes(t.order)
    scalar = scalar_operand(other)
    if scalar is not None:
        if op == "mul" or (op == "truediv" and a is not None):
            term = "A / s" if op == "truediv" else "s * A"
            expr = f"{_access('O', idx)} = {term.replace('A', _access('A', idx))}"
            return _run(expr, {"A": t.format}, t.format, A=t, s=scalar)
        if scalar == 0 and op in ("add", "sub"):
            return t if op == "add" or a is not None else _negate(t)
        raise InputError(
            f"a sparse tensor {symbol} a nonzero number would store every entry; densify "
            "explicitly (T.to_dense()) or write the statement with sparsec.kernel"
            if op != "truediv"
            else "a number divided by a sparse tensor is dense; densify explicitly"
        )
    dense = dense_operand(other)
    if dense is None or op == "truediv":
        return NotImplemented
    di = _trailing(symbol, t, tuple(dense.shape))
    terms = (_access("A", idx), _access("B", di))
    lhs, rhs = terms if a is not None else terms[::-1]
    expr = f"{_access('O', idx)} = {lhs} {symbol} {rhs}"
    return _run(expr, {"A": t.format}, t.format if op == "mul" else None, A=t, B=dense)


def _negate(t: Tensor) -> Tensor:
    idx = _modes(t.order)
    return _run(f"{_access('O', idx)} = -{_access('A', idx)}", {"A": t.format}, t.format, A=t)


def _transpose(t: Any) -> Any:
    """The same levels and values under the reversed mode ordering: level k stored mode
    ``ordering[k]``, which is mode ``order - 1 - ordering[k]`` of the transpose. A bsr(R,C)
    matrix's is bsr(C,R), its blocks transposed by a kernel (``O(j,i) = A(i,j)``)."""
    if isinstance(t, MappedTensor):
        block = t.blocksize()
        if block is None:
            raise InputError(
                f"the transpose of a {t.format} tensor has no {t.format} layout; convert it "
                "first (T.to_format('csr').T)"
            )
        out = parse_mapped(f"bsr({block[1]},{block[0]})", 2)
        return _run("O(j,i) = A(i,j)", {"A": t.format}, out, A=t)
    fmt = Format(t.format.levels, tuple(t.order - 1 - m for m in t.format.ordering))
    flipped = Tensor(t.shape[::-1], fmt, t.levels, t.vals, t.index_dtype)
    return stored(flipped, t.value_dtype) if isinstance(t, Stored) else flipped


def _sum(t: Tensor, axis: Any) -> Any:
    if axis is None:
        summed = set(range(t.order))
    else:
        axes = axis if isinstance(axis, tuple | list) else (axis,)
        if not all(isinstance(x, numbers.Integral) for x in axes):
            raise InputError(f"sum: axis must be None, an int or a tuple of ints, not {axis!r}")
        if not all(-t.order <= int(x) < t.order for x in axes):
            raise ShapeError(f"sum: axis {axis!r} is out of range for order {t.order}")
        summed = {int(x) % t.order for x in axes}
        if len(summed) != len(axes):
            raise ShapeError(f"sum: axis {axis!r} repeats a mode")
    idx = _modes(t.order)
    kept = [v for m, v in enumerate(idx) if m not in summed]
    return _run(f"{_access('O', kept)} = {_access('A', idx)}", {"A": t.format}, None, A=t)


def check_dense(t: Tensor) -> None:
    """Refuse a dense conversion larger than `DENSE_SHARE` of the machine's memory
    (`machine().memory`; nothing is refused where it is unknown)."""
    memory = machine().memory
    need = math.prod(t.shape) * t.dtype.itemsize
    if memory is None or need <= DENSE_SHARE * memory:
        return
    raise InputError(
        f"converting a {' x '.join(map(str, t.shape))} sparsec.Tensor ({t.nnz:,} stored "
        f"entries) to dense would allocate {need / 2**30:,.1f} GiB, more than half of this "
        f"machine's {memory / 2**30:,.1f} GiB; keep it sparse: its operators (@ + - * / .T "
        ".sum) and sparsec.kernel/einsum run on the stored entries, and .to_scipy() / "
        ".to_torch() convert to other sparse types"
    )


#: numpy's ufuncs that are operators here, by the operator they are
_UFUNCS = {
    "matmul": "matmul",
    "add": "add",
    "subtract": "sub",
    "multiply": "mul",
    "divide": "truediv",
    "true_divide": "truediv",
}
_SPARSE_SPELLINGS = (
    "use the Tensor's operators (@ + - * / -T .T .sum), sparsec.einsum or sparsec.kernel, "
    "or convert explicitly (np.asarray(T), T.to_dense(), T.to_scipy(), T.to_torch())"
)


def _refuse(what: str) -> InputError:
    return InputError(
        f"{what} is not defined on a sparsec.Tensor (numpy would densify it silently); "
        + _SPARSE_SPELLINGS
    )


def _ufunc(ufunc: Any, method: str, inputs: tuple[Any, ...], kwargs: Any) -> Any:
    """A numpy ufunc on a Tensor: numpy's operators on arrays (``x + T``, ``x @ T``) and the
    same ufuncs called by name run as the operators; anything else is refused."""
    name = getattr(ufunc, "__name__", str(ufunc))
    spelled = f"numpy.{name}" + (f".{method}" if method != "__call__" else "")
    if method == "__call__" and kwargs:
        raise _refuse(f"{spelled} with {', '.join(sorted(kwargs))}=")
    result: Any = NotImplemented
    if method == "__call__" and len(inputs) == 2 and name in _UFUNCS:
        result = _Implementation().binary(_UFUNCS[name], *inputs)
    elif method == "__call__" and len(inputs) == 1 and name in ("negative", "positive"):
        result = _negate(inputs[0]) if name == "negative" else inputs[0]
    if result is NotImplemented:
        known = name in _UFUNCS and method == "__call__"
        raise _refuse(spelled + " on these operands" if known else spelled)
    return result


def _function(func: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """A numpy function on a Tensor (``__array_function__``): ``dot``, ``matmul``, ``sum``,
    ``transpose``, ``shape``, ``ndim`` mean what the operators do; the rest is refused."""
    name = getattr(func, "__name__", str(func))
    params = {"sum": ("a", "axis"), "transpose": ("a", "axes")}.get(name, ("a", "b"))
    bound = dict(zip(params, args, strict=False)) | dict(kwargs)
    if len(args) > len(params):
        raise _refuse(f"numpy.{name} with these arguments")
    t = next((x for x in args if isinstance(x, Tensor)), None)
    if name == "dot" and len(args) == 2 and not kwargs:
        either = scalar_operand(args[0]) is not None or scalar_operand(args[1]) is not None
        result = _elementwise("mul", *args) if either else _matmul(*args)
        if result is not NotImplemented:
            return result
    elif name == "sum" and t is not None and set(bound) <= {"a", "axis"}:
        return _sum(t, bound.get("axis"))
    elif name == "transpose" and t is not None and set(bound) <= {"a", "axes"}:
        axes = bound.get("axes")
        if axes is None or tuple(axes) == tuple(range(t.order - 1, -1, -1)):
            return _transpose(t)
    elif name in ("shape", "ndim", "size") and t is not None and len(args) == 1:
        return {"shape": t.shape, "ndim": t.order, "size": math.prod(t.shape)}[name]
    elif name == "einsum":
        raise InputError(
            "numpy.einsum would densify a sparsec.Tensor; sparsec.einsum takes the same "
            "subscripts and runs on the stored entries"
        )
    raise _refuse(f"numpy.{name}" + (" with these arguments" if name in _FUNCTIONS else ""))


_FUNCTIONS = ("dot", "sum", "transpose")


class _Implementation:
    """The `sparsec.tensors.ops.ArrayImpl` these operators provide."""

    def binary(self, op: str, left: Any, right: Any) -> Any:
        return _matmul(left, right) if op == "matmul" else _elementwise(op, left, right)

    def unary(self, op: str, tensor: Any) -> Any:
        return _negate(tensor) if op == "neg" else _transpose(tensor)

    def reduce(self, tensor: Any, axis: Any) -> Any:
        return _sum(tensor, axis)

    def check_dense(self, tensor: Any) -> None:
        check_dense(tensor)

    def ufunc(self, ufunc: Any, method: str, inputs: tuple[Any, ...], kwargs: Any) -> Any:
        return _ufunc(ufunc, method, inputs, kwargs)

    def function(self, func: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        return _function(func, args, kwargs)


ops.register(_Implementation())
