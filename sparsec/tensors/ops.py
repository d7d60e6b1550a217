"""`Tensor` as a sparse array: its operators, reached through a registry.

The operators (``@ + - * /``, ``.T``, ``.sum``, ``len``) run generated kernels, which live
stages above this one (`sparsec.api.array`). So `Tensor` inherits `ArrayOps`, whose methods
only forward to the implementation registered here (`register`, called when `sparsec` is
imported): the dependency points down, the call goes up. A binary operator returns
``NotImplemented`` for an operand kind the implementation does not take, so Python asks the
other operand (and, for an unknown pair, raises its usual TypeError).

numpy's entry points all reach the same operators or a clear refusal, never a silent
dense copy: its ufuncs (``np.add``, ``np.matmul``, and so ``x @ T``, ``np.float64(2) * T``)
through ``__array_ufunc__``, its functions (``np.dot``, ``np.sum``, ``np.transpose``, ...)
through ``__array_function__``; what has no sparse meaning is an `InputError` naming the
sparse spelling. ``np.asarray(T)`` is an explicit conversion and still converts (under the
memory check of `check_dense`), as does a scipy constructor (``sp.csr_array(T)``), except
where a scipy.sparse operator asks for it: scipy densifies an operand it does not know
(``A @ T`` calls ``np.asanyarray(T)``), so `densify_check` refuses that call and says to
convert the scipy operand instead.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ..base.errors import InputError


class ArrayImpl(Protocol):
    """What `sparsec.api.array` provides: each operator on a Tensor and another operand."""

    def binary(self, op: str, left: Any, right: Any) -> Any:
        """``left op right`` for op in ``matmul add sub mul truediv``; one side a Tensor."""

    def unary(self, op: str, tensor: Any) -> Any:
        """``neg`` or ``transpose`` of a Tensor."""

    def reduce(self, tensor: Any, axis: Any) -> Any:
        """The sum over ``axis`` (None: all modes), dense."""

    def check_dense(self, tensor: Any) -> None:
        """Raise when ``tensor`` densified would not fit in memory."""

    def ufunc(self, ufunc: Any, method: str, inputs: tuple[Any, ...], kwargs: Any) -> Any:
        """A numpy ufunc call with a Tensor among ``inputs``: its result or a refusal."""

    def function(self, func: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
        """A numpy function (``__array_function__``) with a Tensor among ``args``."""


_impl: list[ArrayImpl] = []


def register(impl: ArrayImpl) -> None:
    """Install the operators' implementation (the last registered one wins)."""
    _impl.append(impl)


def implementation() -> ArrayImpl:
    if not _impl:  # `import sparsec` registers it; only a partial import lacks it
        raise RuntimeError("sparsec.Tensor operators need `import sparsec` (sparsec.api.array)")
    return _impl[-1]


def check_dense(tensor: Any) -> None:
    """The memory check of a dense conversion, where the implementation is installed."""
    if _impl:
        _impl[-1].check_dense(tensor)


def densify_check() -> None:
    """Refuse a dense conversion (``__array__``) that scipy.sparse asks for: the first caller
        outside numpy is a scipy.sparse function other than a constructor (scipy densifies the
    operands of its operators that it does not know)."""
    frame = sys._getframe(2)  # the caller of Tensor.__array__
    while frame is not None and frame.f_globals.get("__name__", "").startswith("numpy"):
        frame = frame.f_back  # type: ignore[assignment]
    module = "" if frame is None else frame.f_globals.get("__name__", "")
    # a constructor (sp.csr_array(T)) is a conversion the caller asked for, as np.asarray
    if module.startswith("scipy.sparse") and frame.f_code.co_name != "__init__":
        raise InputError(
            "scipy.sparse would convert a sparsec.Tensor to a dense array (it densifies "
            "operands it does not know, as in `A @ T`); convert the scipy operand instead: "
            "sparsec.as_tensor(A) @ T runs sparse, or T.to_scipy() stays in scipy"
        )


class ArrayOps:
    """The array protocol of `Tensor` (numpy's spelling), forwarded to `implementation`.

    ``bool(T)`` stays an object's truth (always true), not numpy's ambiguity error nor
    ``len(T) > 0``: code that tests an optional tensor with ``if t:`` keeps working."""

    __slots__ = ()

    shape: tuple[int, ...]

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return implementation().ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return implementation().function(func, tuple(args), kwargs)

    def __matmul__(self, other: Any) -> Any:
        return implementation().binary("matmul", self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return implementation().binary("matmul", other, self)

    def __add__(self, other: Any) -> Any:
        return implementation().binary("add", self, other)

    def __radd__(self, other: Any) -> Any:
        return implementation().binary("add", other, self)

    def __sub__(self, other: Any) -> Any:
        return implementation().binary("sub", self, other)

    def __rsub__(self, other: Any) -> Any:
        return implementation().binary("sub", other, self)

    def __mul__(self, other: Any) -> Any:
        return implementation().binary("mul", self, other)

    def __rmul__(self, other: Any) -> Any:
        return implementation().binary("mul", other, self)

    def __truediv__(self, other: Any) -> Any:
        return implementation().binary("truediv", self, other)

    def __neg__(self) -> Any:
        return implementation().unary("neg", self)

    def __pos__(self) -> Any:
        return self

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of an order-0 sparsec.Tensor (a scalar)")
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def T(self) -> Any:  # noqa: N802  (numpy's name)
        """The transpose (modes reversed): the same storage arrays under the reversed mode
        ordering (CSR of an m x n matrix is CSC of the n x m one), O(1), no sort."""
        return implementation().unary("transpose", self)

    def sum(self, axis: int | tuple[int, ...] | None = None) -> Any:
        """The sum over ``axis`` (an int or tuple, negative from the end; None: every mode,
        a scalar), dense like numpy's, computed by a generated reduction kernel."""
        return implementation().reduce(self, axis)
