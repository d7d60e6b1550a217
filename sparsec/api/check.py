"""Checking a kernel against dense torch: `Kernel.check`'s verdict (`verdict`), and the
inputs `Kernel.random_inputs` draws for it (`extents`, `random_inputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..base.errors import InputError, SparsecError
from ..base.values import is_integral
from ..frontend.notation import Assignment
from ..frontend.semirings import Semiring, semiring
from ..middle.spec import Spec, TensorVar
from ..runtime import device
from ..runtime.inputs import Prepared
from ..tensors.halves import HALF, readable
from ..tensors.tensor import Tensor
from . import footprint

DEFAULT_EXTENTS = (23, 19, 17, 13, 11, 7)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of `Kernel.check`: the largest absolute error against the reference it
    compared with (``reference``: dense torch, or a semiring's dense numpy evaluation)."""

    max_abs_error: float
    dtype: str
    reference: str = "dense torch"

    def __str__(self) -> str:
        return (
            f"ok: matches {self.reference} (max abs error {self.max_abs_error:.3g}, {self.dtype})"
        )


def require_torch() -> None:
    """`Kernel.check` compares with torch: say how to install it where it is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SparsecError(
            "Kernel.check compares with torch, which is not installed; install a CPU "
            "build with `pip install torch==2.13.0` (or the extra sparsec[torch])"
        ) from None


def verdict(
    assignment: Assignment,
    spec: Spec,
    wanted: tuple[TensorVar, ...],
    prepared: Prepared,
    got: Any,
) -> CheckResult:
    """Compare a kernel's result ``got`` on ``prepared`` inputs with ``torch.einsum`` on
    the densified inputs (`sparsec.api.reference`), or under a semiring with its dense
    numpy evaluation (`semiring_reference`); a mismatch is a `CheckError`."""
    import torch

    from .reference import compare, reference
    from .semiring_reference import in_type, semiring_reference

    if prepared.device and np.ndim(got):
        got = device.cupy_device().asnumpy(got)  # compared on the host
    integral = is_integral(prepared.dtype)
    dense, stored = {}, {}
    for t in wanted:
        v = prepared.values[t.name]
        if device.on_device(v):
            v = device.cupy_device().asnumpy(v)  # in level order, like a host value
        if isinstance(v, Tensor):
            # structural presence: the stored entries, explicit zeros included
            mask = np.zeros(v.shape, dtype=bool)
            mask[tuple(v.coords()[0])] = True
            stored[t.argument] = torch.from_numpy(mask)
            v = v.to_dense()
        elif t.order:
            v = readable(v, prepared.dtype)  # bfloat16 storage: its values, as float32
            if t.format.ordering != tuple(range(t.order)):
                v = np.transpose(v, np.argsort(t.format.ordering))  # back to mode order
        # an integral kernel's reference computes in its type (exactly, wrapping)
        dense[t.argument] = torch.from_numpy(
            np.array(v, dtype=prepared.dtype if integral else np.float64)
        )
    current = dense.pop(spec.output.name, None)
    stored.pop(spec.output.name, None)
    ring = semiring(spec.semantics.semiring)
    against = "dense torch" if ring.is_default else f"the dense {ring.name} reference (numpy)"
    if integral:
        against = f"the dense {ring.name} reference in {prepared.dtype} (numpy)"
    if ring.is_default and not integral:
        division = spec.semantics.division
        want = reference(assignment, dense, prepared.dims, current, stored, division).numpy()
    else:
        # GraphBLAS's model: absent entries are the add's identity (`semiring_reference`)
        def under(ring: Semiring) -> np.ndarray:
            return semiring_reference(
                assignment,
                {name: v.numpy() for name, v in dense.items()},
                {name: m.numpy() for name, m in stored.items()},
                ring,
                None if current is None else current.numpy(),
                sparse_output=not spec.output.format.is_dense,
                dtype=prepared.dtype if integral else "float64",
            )

        want = under(ring)
        if ring.add == "any":
            # any one of the terms' values: whatever lies between the least and the
            # greatest (the least where nothing does)
            most = under(replace(ring, np_add="maximum"))
            value = got.to_dense() if isinstance(got, Tensor) else np.asarray(got)
            within = (value >= want) & (value <= most)
            want = np.where(within, value, want).astype(want.dtype)
    if spec.semantics.mask:
        identity = in_type(ring.identity, np.dtype(prepared.dtype if integral else "float64"))
        want = _masked(want, spec, stored, current, identity)
    if isinstance(got, Tensor):
        got.validate(spec.output.name)  # the assembled storage keeps every invariant
    err = compare(np.asarray(got), want, prepared.dtype, f"kernel {assignment}", against)
    return CheckResult(err, prepared.dtype, against)


def _masked(want: Any, spec: Spec, stored: Mapping[str, Any], current: Any, identity: float) -> Any:
    """The unmasked reference ``want`` kept where the mask allows (``M``: where it stores an
    entry, explicit zeros included; ``~M``: where it stores none), read from the mask's own
    stored pattern, not from the compiler's rewrite; elsewhere the output keeps its current
    value (``+=``) or stays absent (the add's identity, 0 for plus_times)."""
    pattern = stored.get(spec.pattern)
    allowed = np.ones(np.shape(want), dtype=bool) if pattern is None else pattern.numpy()
    if spec.semantics.mask.startswith("~"):
        allowed = ~allowed
    base = identity if current is None else np.asarray(current)
    return np.where(allowed, want, base)


def extents(
    assignment: Assignment, spec: Spec, dims: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Every index's extent for `random_inputs`: ``dims`` where given, distinct small
    defaults elsewhere (so shape mix-ups show), equal where a tensor used twice needs it."""
    dims = dict(dims or {})
    given = set(dims)
    unknown = [i for i in dims if i not in spec.indices]
    if unknown:
        raise InputError(
            f"--dims names {', '.join(unknown)}, not an index of {assignment} "
            f"(indices: {', '.join(spec.indices)})"
        )
    for n, index in enumerate(spec.indices):
        dims.setdefault(index, DEFAULT_EXTENTS[n % len(DEFAULT_EXTENTS)])
    # a tensor used with different index lists needs equal extents mode by mode
    # the accesses as written too: a tensor read through derived inputs (B(j,i) read as
    # B_as, A(i,i) as A_diag) is passed as written (sparsec.middle.derive)
    reads = (*spec.assignment.accesses(), *assignment.accesses())
    for a in reads:
        first = next(b for b in reads if b.name == a.name)
        for mine, theirs in zip(a.indices, first.indices, strict=True):
            if dims[mine] != dims[theirs]:
                if mine in given:
                    raise InputError(
                        f"{a.name} is used as {first} and {a}, so {theirs} and {mine} "
                        f"need equal extents, not {dims[theirs]} and {dims[mine]}"
                    )
                dims[mine] = dims[theirs]
    return {i: dims[i] for i in spec.indices}


def random_inputs(
    assignment: Assignment,
    spec: Spec,
    wanted: tuple[TensorVar, ...],
    dims: Mapping[str, int] | None,
    seed: int,
    density: float,
    dtype: str | None,
    index_dtype: str | None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """`Kernel.random_inputs`: random values for the tensors ``wanted``, and the extents."""
    from ..tensors.tensor import random

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, not {seed!r}")
    if not 0 <= density <= 1:
        raise InputError(f"density must be in [0, 1], got {density}")
    dims = extents(assignment, spec, dims)
    shown = ",".join(f"{i}={n}" for i, n in dims.items())
    parts = footprint.check_parts(spec, dims, density=density, check=False)
    footprint.ensure_fits(parts, f"random inputs for {assignment} ({shown})")
    rng = np.random.default_rng(seed)
    # a 16-bit kernel rounds float32 inputs to its type (as it binds them)
    dtype = "float32" if dtype in HALF else dtype or "float64"
    accesses = {a.name: a for a in (*spec.assignment.accesses(), *assignment.accesses())}
    inputs: dict[str, Any] = {}
    integral = is_integral(dtype)
    for n, t in enumerate(wanted):
        shape = tuple(dims[i] for i in accesses[t.name].indices)
        if t.order == 0:
            if integral:  # 1 to 3 (bool: True)
                inputs[t.argument] = np.asarray(rng.integers(1, 4)).astype(dtype).item()
            else:
                inputs[t.argument] = float(rng.uniform(0.5, 2.0))
        elif t.is_dense:
            # an integral kernel's: nonzero integers in [-4, 4] (wrapped for unsigned types)
            drawn = rng.integers(1, 5, shape) * rng.choice([-1, 1], shape) if integral else None
            values = rng.uniform(-1, 1, shape) if drawn is None else drawn
            arr = np.where(rng.random(shape) < max(density, 0.5), values, 0)
            if shape[0] > 2:
                arr[rng.integers(shape[0])] = 0.0
            inputs[t.argument] = arr.astype(dtype)
        else:
            inputs[t.argument] = random(
                shape, density, t.format, seed=seed + n, dtype=dtype, index_dtype=index_dtype
            )
    return inputs, dims
