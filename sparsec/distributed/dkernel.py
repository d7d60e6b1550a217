"""`sd.kernel`: a `sparsec.Kernel` whose calls run part by part on Dask workers.

A call picks the split (`plan`), sends each part its inputs (the split tensor's part, slices
of operands indexed by the split index, the rest broadcast once), runs the kernel on every
part as a task, and combines the parts' outputs: side by side, by shifting ``pos``, or by a
tree of additions. Workers rebuild the kernel from its arguments once per process and load
the compiled library from the on-disk cache (or build their own for another CPU).
"""

from __future__ import annotations

import pickle
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api.check import CheckResult, require_torch, verdict
from ..api.kernel import Kernel
from ..base.errors import FormatError, InputError, SparsecError
from ..tensors.tensor import Tensor, as_tensor
from . import partition as planner
from ._dask import client_of
from .tasks import plain_formats
from .tensor import DistributedTensor, check_parts, default_parts, from_tensor

#: times a call is run again after a failure that is not the kernel's (a worker lost mid-call:
#: the driver's operands are sent again, parts built by tasks are redone by Dask)
RETRIES = 2


class DistributedKernel:
    """``sd.kernel(expr, formats, ...)``: the arguments of `sparsec.kernel`."""

    def __init__(self, expr: str, formats: Any = None, **options: Any) -> None:
        self.kernel = Kernel(expr, formats, **options)
        if self.kernel.demapped is not None:
            raise FormatError(
                f"{expr}: sparsec.distributed does not split tensors in mapped formats (bsr, "
                "nm) yet; convert them to csr, csc or coo for a distributed call"
            )
        self.assignment = self.kernel.assignment
        self._args = pickle.dumps(self.kernel.__reduce__()[1])
        out = self.kernel.spec.output
        self._out_order = out.format.ordering if out.order else ()
        self._out_dense = out.format.is_dense
        self._mask = self.kernel.semantics.mask
        self._parts: dict[str, PartsKernel] = {}

    def parts_kernel(self, index: str) -> PartsKernel:
        """What the parts of a call split along ``index`` run: this kernel, or where a
        tensor is read both at ``index`` and elsewhere, its statement with the two
        operands named apart (`partition.parts_statement`)."""
        found = self._parts.get(index)
        if found is None:
            ops = planner.operands(self.assignment, index, self._mask)
            k = self.kernel
            if any(op.local != op.name for op in ops):
                statement = planner.parts_statement(self.assignment, index, ops)
                formats = plain_formats(k)
                formats.update((op.local, formats[op.name]) for op in ops)
                try:
                    k = Kernel(str(statement), formats, **k.keywords())
                except SparsecError as err:
                    raise SparsecError(
                        f"{self.assignment}: its parts along {index!r} run {statement} (a "
                        f"tensor read both at {index!r} and elsewhere is two operands), "
                        f"which fails: {err}"
                    ) from None
            args = self._args if k is self.kernel else pickle.dumps(k.__reduce__()[1])
            found = self._parts[index] = PartsKernel(k, args, tuple(ops))
        return found

    @property
    def expression(self) -> str:
        return self.kernel.expression

    def __repr__(self) -> str:
        return f"DistributedKernel({self.kernel!r})"

    # ----------------------------------------------------------------- planning
    def _choose(self, inputs: Mapping[str, Any]) -> tuple[str, str, str, int]:
        """(kind, index, tensor, mode): the class and the split (no data moves)."""
        found = self._classify(inputs)
        if found[0] == "reduce" and self._semiring_not_plus():
            raise SparsecError(
                f"{self.assignment}: splitting {found[2]} along the summed index {found[1]!r} "
                f"adds partial outputs with +, not with the {self.kernel.semantics.semiring} "
                "semiring's add; distribute along an output index instead (another format)"
            )
        return found

    def _classify(self, inputs: Mapping[str, Any]) -> tuple[str, str, str, int]:
        formats = self.kernel.formats
        idx = planner.rhs_indices(self.assignment)
        names = [n for n in idx if n in inputs]
        dist = [n for n in names if isinstance(inputs[n], DistributedTensor)]
        if dist:
            name = dist[0]
            kind, index, mode = planner.classify(
                self.assignment, self._out_order, self._out_dense, name, inputs[name].mode
            )
            return kind, index, name, mode
        sparse = [n for n in names if idx[n] and not formats[n].is_dense]
        dense = {n: inputs[n] for n in names if idx[n] and formats[n].is_dense}
        sparse_bytes = sum(_nbytes(inputs[n]) for n in sparse)
        rep = planner.replicate_index(self.assignment, dense, sparse)
        if rep is not None and (not sparse or _nbytes(dense[rep[0]]) > sparse_bytes):
            return "replicate", rep[1], rep[0], idx[rep[0]].index(rep[1])
        if not sparse:
            raise InputError(
                f"{self.assignment}: nothing to distribute; pass a DistributedTensor "
                "(sd.from_scipy, sd.read_mtx, sd.open, ...) or a sparse operand"
            )
        name = max(sparse, key=lambda n: _nbytes(inputs[n]))
        fmt = plain_formats(self.kernel)[name]
        kind, index, mode = planner.classify(
            self.assignment, self._out_order, self._out_dense, name, fmt.ordering[0]
        )
        if kind == "repartition":  # driver data is cut along that mode in the first place
            kind = "concatenate"
        return kind, index, name, mode

    def _checked(self, inputs: Mapping[str, Any]) -> tuple[tuple[str, str, str, int], dict]:
        """The call's split and each index's extent, after checking on the driver that
        the inputs are those the kernel takes and that their shapes agree."""
        if inputs.keys() != self.kernel.binder.names:
            raise self.kernel.binder.name_error(inputs)
        chosen = self._choose(inputs)
        shapes = {n: _shape(v) for n, v in inputs.items()}
        return chosen, planner.extents(self.assignment, self._mask, shapes)

    def plan(self, /, *, parts: int | None = None, client: Any = None, **inputs: Any) -> Any:
        """The class, split, bytes each part receives and imbalance of a call (moves nothing)."""
        client = client_of(client)
        parts = check_parts(parts)
        inputs = {n: _host(v) for n, v in inputs.items()}
        (kind, index, name, mode), dims = self._checked(inputs)
        value = inputs[name]
        if isinstance(value, DistributedTensor):
            counts = value.part_nnz
            ranges = value.bounds
            if kind == "repartition":
                ranges = planner.even_ranges(value.shape[mode], value.parts)
                counts = [value.nnz // max(1, len(ranges))] * len(ranges)
            moved = _entry_bytes(value) * value.nnz if kind == "repartition" else 0
            own = [n * _entry_bytes(value) for n in counts]
        else:
            extent = np.shape(value)[mode] if kind == "replicate" else as_tensor(value).shape[mode]
            ranges = planner.even_ranges(extent, parts or default_parts(client))
            counts, moved = [1] * len(ranges), 0
            own = [int(_nbytes(value) * (b - a) / max(1, extent)) for a, b in ranges]
        shared, sliced = self._operand_bytes(inputs, index, name, mode, ranges, dims)
        per = tuple(o + shared + s for o, s in zip(own, sliced, strict=True))
        mean = sum(counts) / max(1, len(counts))
        imbalance = max(counts) / mean if mean else 1.0
        return planner.Partition(kind, index, name, len(ranges), per, imbalance, moved, mode)

    def _operand_bytes(
        self,
        inputs: Mapping[str, Any],
        index: str,
        split_name: str,
        mode: int,
        ranges: list[tuple[int, int]],
        dims: dict[str, int],
    ) -> tuple[int, list[int]]:
        """(bytes every part receives, bytes each part's slices add) of the operands other
        than the split tensor's own parts."""
        shared, out = 0, [0] * len(ranges)
        sent: set[str] = set()
        for op in self.parts_kernel(index).operands:
            if op.name == split_name and op.axes == (mode,):
                continue
            size = _nbytes(inputs[op.name])
            if not op.sliced:
                shared += 0 if op.name in sent else size
                sent.add(op.name)
                continue
            for p, (a, b) in enumerate(ranges):
                out[p] += int(size * ((b - a) / max(1, dims[index])) ** len(op.axes))
        return shared, out

    # ----------------------------------------------------------------- calling
    def __call__(
        self,
        /,
        *,
        parts: int | None = None,
        client: Any = None,
        out: str | None = None,
        threads: int | None = 1,
        **inputs: Any,
    ) -> Any:
        """Run on the workers: numpy for a dense output, a `sparsec.Tensor` for a sparse one,
        or a `DistributedTensor` (parts on the workers) with ``out="distributed"``."""
        from .run import execute

        client = client_of(client)
        parts = check_parts(parts)
        if out not in (None, "distributed"):
            raise InputError(f"out={out!r}: give out='distributed' or leave it out")
        inputs = {n: _host(v) for n, v in inputs.items()}
        (kind, index, name, mode), dims = self._checked(inputs)
        value = inputs[name]
        if kind == "repartition":
            assert isinstance(value, DistributedTensor)
            moved = _entry_bytes(value) * value.nnz
            warnings.warn(
                f"{self.assignment}: {name} is split along mode {value.mode} but the sparse "
                f"output's outermost level is index {index!r}; repartitioning {name} moves "
                f"{value.nnz} entries ({moved} bytes) between workers",
                stacklevel=2,
            )
            inputs[name] = value.repartition(mode=mode)
        elif kind != "replicate" and not isinstance(value, DistributedTensor):
            inputs[name] = from_tensor(
                as_tensor(value, plain_formats(self.kernel)[name]),
                parts,
                client=client,
                mode=mode,
                name=name,
            )
        if kind != "replicate":
            dt = inputs[name]
            if dt.overlapping and (
                kind == "reduce" or not planner.overlap_safe(self.assignment, name)
            ):
                inputs[name] = dt.repartition()  # whole slices only
            elif dt.overlapping and self._semiring_not_plus():
                inputs[name] = dt.repartition()
        if isinstance(inputs[name], DistributedTensor):
            self.build(inputs[name].dtype.name, inputs[name].index_dtype.name, index)
        for attempt in range(RETRIES + 1):
            try:
                return execute(
                    self, client, kind, index, name, dims, inputs, parts, out, threads, attempt > 0
                )
            except SparsecError:
                raise
            except Exception as err:  # a worker lost mid-call (its comm closed, a copy gone)
                held = inputs[name]
                if isinstance(held, DistributedTensor) and held.unrecoverable():
                    raise held.lost_error(err) from None
                if attempt == RETRIES:
                    raise
                time.sleep(0.5 * (attempt + 1))  # let the scheduler drop the dead worker
        raise AssertionError("unreachable")  # pragma: no cover

    def build(self, dtype: str, index_dtype: str, index: str | None = None) -> None:
        """Compile on the driver before the parts run (those of a call split along
        ``index``), so that workers sharing its compile cache load the library instead of
        each building it (a worker on another CPU builds its own: the cache key includes
        the target). Where it cannot be built here, the workers report why."""
        k = self.kernel if index is None else self.parts_kernel(index).kernel
        try:
            k.executable(k.dtype or dtype, k.index_dtype or index_dtype)
        except SparsecError:
            pass

    def _semiring_not_plus(self) -> bool:
        return self.kernel.semantics.semiring != "plus_times"

    def check(
        self, /, *, parts: int | None = None, client: Any = None, **inputs: Any
    ) -> CheckResult:
        """Run distributed and compare with ``torch.einsum`` on the gathered dense inputs."""
        require_torch()
        got = self(parts=parts, client=client, **inputs)
        inputs = {n: _host(v) for n, v in inputs.items()}
        local = {
            n: v.to_tensor() if isinstance(v, DistributedTensor) else v for n, v in inputs.items()
        }
        prepared = self.kernel.binder.prepare(local)
        return verdict(self.assignment, self.kernel.spec, self.kernel.binder.wanted, prepared, got)


def kernel(expr: str, formats: Any = None, **options: Any) -> DistributedKernel:
    """A distributed kernel: the arguments of `sparsec.kernel`."""
    return DistributedKernel(expr, formats, **options)


# ----------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class PartsKernel:
    """The kernel a call's parts run, its pickled arguments, and how each operand reaches
    the parts (`partition.Operand`)."""

    kernel: Kernel
    args: bytes
    operands: tuple[planner.Operand, ...]


def _host(value: Any) -> Any:
    """Driver values as numpy or sparsec tensors (torch dense -> numpy, torch sparse ->
    Tensor, nested lists -> numpy)."""
    if isinstance(value, DistributedTensor | Tensor | np.ndarray | int | float):
        return value
    if isinstance(value, list | tuple):
        return np.asarray(value)
    if hasattr(value, "tocoo"):  # scipy sparse
        return as_tensor(value)
    if type(value).__module__.startswith("torch"):
        if (
            getattr(value, "is_sparse", False)
            or getattr(value, "layout", None) is not None
            and "sparse" in str(value.layout)
        ):
            return as_tensor(value)
        return value.detach().cpu().numpy()
    return value


def _shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    return tuple(int(n) for n in (np.shape(value) if shape is None else shape))


def _nbytes(value: Any) -> int:
    if isinstance(value, DistributedTensor):
        return value.nnz * _entry_bytes(value)
    if isinstance(value, Tensor):
        return int(value.vals.nbytes + sum(a.nbytes for st in value.levels for a in st.arrays()))
    if hasattr(value, "tocoo"):
        return int(value.data.nbytes * 2 + getattr(value, "indices", value.data).nbytes)
    return int(np.asarray(value).nbytes)


def _entry_bytes(t: DistributedTensor) -> int:
    """Bytes one stored entry moves as coordinates and a value."""
    return t.dtype.itemsize + t.order * t.index_dtype.itemsize
