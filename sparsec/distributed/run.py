"""Running a planned distributed call: each part's inputs, one task per part, and combining
the parts' outputs (placed side by side, joined by shifting ``pos``, or added by a tree)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensors.tensor import Tensor, as_tensor
from . import partition as planner
from . import split, tasks
from .tensor import DistributedTensor, default_parts


def execute(
    dk: Any,
    client: Any,
    kind: str,
    index: str,
    name: str,
    dims: dict[str, int],
    inputs: dict[str, Any],
    parts: int | None,
    out: str | None,
    threads: int | None,
    resend: bool = False,
) -> Any:
    """One call (``dims``: each index's extent, checked on the driver); ``resend``: the
    driver's operands travel inside tasks (a retry after a worker was lost: a scatter may
    still pick the dead worker, a task is placed by the scheduler and redone if lost)."""
    parted = dk.parts_kernel(index)
    primary = inputs[name]
    if kind == "replicate":
        ranges = planner.even_ranges(dims[index], parts or default_parts(client))
        owner: DistributedTensor | None = None
    else:
        assert isinstance(primary, DistributedTensor)
        ranges, owner = primary.bounds, primary
        if primary.unrecoverable():
            raise primary.lost_error(RuntimeError("lost"))
    per_part: list[dict[str, Any]] = [{} for _ in ranges]
    sent: dict[str, Any] = {}  # each tensor sent whole once per call
    for op in parted.operands:
        v = inputs[op.name]
        if not op.indices:  # scalars travel in the task
            futures = [v] * len(ranges)
        elif not op.sliced:
            if op.name not in sent:
                value = v.to_tensor() if isinstance(v, DistributedTensor) else v
                sent[op.name] = _send(client, [value], resend, broadcast=True)[0]
            futures = [sent[op.name]] * len(ranges)
        elif isinstance(v, DistributedTensor):
            futures = _distributed_slices(client, v, op.axes, ranges)
        elif isinstance(v, np.ndarray):
            futures = client.scatter(hash=False, data=[_dense_slice(v, op.axes, r) for r in ranges])
        else:
            t = as_tensor(v, dk.kernel.formats[op.name])
            futures = _send(client, [split.cut(t, op.axes, a, b) for a, b in ranges], resend)
        for d, f in zip(per_part, futures, strict=True):
            d[op.local] = f
    names = list(per_part[0]) if per_part else []
    label = f"{name} along index {index!r}"
    results = [
        client.submit(
            tasks.run_part,
            parted.args,
            f"part {p} of {len(ranges)} ({label}, range {a}:{b})",
            names,
            threads,
            *[per_part[p][n] for n in names],
            pure=False,
        )
        for p, (a, b) in enumerate(ranges)
    ]
    gather = owner.gather_futures if owner is not None else client.gather
    out_idx = dk.assignment.lhs.indices
    shape = tuple(dims[i] for i in out_idx)
    if kind == "reduce":
        return _reduce(dk, client, results, gather, shape)
    axis = out_idx.index(index)
    if out == "distributed":
        return _distributed_out(dk, client, results, ranges, axis, shape, gather)
    got = gather(results)
    if isinstance(got[0], Tensor):
        return split.join(got, ranges, axis, shape)
    dtype = np.result_type(*[np.asarray(g).dtype for g in got])
    whole = np.zeros(shape, dtype=dtype)
    for g, (a, b) in zip(got, ranges, strict=True):
        at = [slice(None)] * len(shape)
        at[axis] = slice(a, b)
        whole[tuple(at)] += g
    return whole


def _send(client: Any, data: list[Any], resend: bool, broadcast: bool = False) -> list[Any]:
    """The driver's operands, each carried by a task: the scheduler places it on a live
    worker and redoes it if that worker dies (a ``scatter`` just after a worker died can
    pick the dead one and wait for it forever). ``resend``/``broadcast`` are kept for a
    transport that distinguishes them; Dask copies a task's result to the workers that need it."""
    del resend, broadcast
    return [client.submit(tasks.identity, d, pure=False) for d in data]


def _dense_slice(v: np.ndarray, axes: tuple[int, ...], r: tuple[int, int]) -> np.ndarray:
    at = tuple(slice(*r) if k in axes else slice(None) for k in range(v.ndim))
    return np.ascontiguousarray(v[at])


def _distributed_slices(
    client: Any, v: DistributedTensor, axes: tuple[int, ...], ranges: list[tuple[int, int]]
) -> list[Any]:
    """Parts of ``v`` over ``ranges`` on every mode of ``axes``: its own parts where they
    are those, else parts re-cut along one of the modes and then cut on the others."""
    first = v.mode if v.mode in axes else axes[0]
    if not (v.mode == first and v.bounds == ranges):
        v = v.aligned(first, [split.Cut(0, 0, a, b) for a, b in ranges])
    rest = [ax for ax in axes if ax != first]
    if not rest:
        return v.futures
    return [
        client.submit(tasks.cut_part, f, rest, a, b, pure=False)
        for f, (a, b) in zip(v.futures, ranges, strict=True)
    ]


def _reduce(dk: Any, client: Any, results: list[Any], gather: Any, shape: tuple[int, ...]) -> Any:
    """Partial outputs added pairwise by tasks (sparse ones by sparsec's own sparse add)."""
    add_args = None
    if not dk._out_dense and shape:
        add_args = _add_kernel_args(dk, len(shape))
    level = list(results)
    while len(level) > 1:
        nxt = [
            client.submit(tasks.add, level[i], level[i + 1], add_args, pure=False)
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return gather(level)[0]


def _add_kernel_args(dk: Any, order: int) -> bytes:
    import pickle

    from ..api.kernel import Kernel

    letters = ",".join(f"i{k}" for k in range(order))
    fmt = dk.kernel.spec.output.format
    k = Kernel(
        f"S({letters}) = P({letters}) + Q({letters})",
        {"S": fmt, "P": fmt, "Q": fmt},
        dtype=dk.kernel.dtype,
        index_dtype=dk.kernel.index_dtype,
    )
    return pickle.dumps(k.__reduce__()[1])


def _distributed_out(
    dk: Any,
    client: Any,
    results: list[Any],
    ranges: list[tuple[int, int]],
    axis: int,
    shape: tuple[int, ...],
    gather: Any,
) -> DistributedTensor:
    from ..base.errors import InputError

    if dk._out_dense:
        raise InputError(
            "out='distributed' is for sparse outputs; a dense output comes back as numpy"
        )
    if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
        raise InputError("out='distributed' needs parts over disjoint ranges")
    meta = gather([client.submit(tasks.meta, r) for r in results])
    starts = np.concatenate([[0], np.cumsum([m[0] for m in meta])]).astype(int)
    cuts = [split.Cut(int(starts[p]), int(starts[p + 1]), a, b) for p, (a, b) in enumerate(ranges)]
    fmt = dk.kernel.spec.output.format
    return DistributedTensor(
        client,
        results,
        cuts,
        shape,
        fmt,
        axis,
        meta[0][1],
        meta[0][2],
        "tasks",
        dk.assignment.lhs.name,
    )
