"""Derived inputs: accesses fed at call time from a passed tensor in another layout.

Two accesses are not lowered as written, but read an internal input (`Derived`) that the
runtime computes from the caller's tensor once per call, or once per `sparsec.Tensor`
(immutable, so the copy is kept on it):

- a **repeated index** (``A(i,i)``, ``B(i,i,j)``) is an equality filter on the stored
  coordinates: the access reads the entries whose repeated coordinates agree, with one
  mode per distinct variable (``A_diag(i)``). Its levels keep the kinds of the original
  ones (a variable over a compressed level stays compressed, so presence is exactly "A
  stores (i,i)"); every later stage sees an ordinary access.
- a **re-layout** where no loop order fits every operand's level order (``B(i,j) *
  C(i,j)`` with B csr and C csc; ``B(i,j) + B(j,i)``, a tensor read in two mode orders):
  the cheapest set of sparse reads is fed from a copy of its tensor with the levels in
  another mode ordering (CSR -> CSC), so that a loop order exists.

A third kind feeds a **dense** read from a transposed copy (`contiguous`): where the loop
order walks a dense operand in its innermost loop along a mode that is not its last level
(SDDMM ``A(i,j) = B(i,j) * C(i,k) * D(k,j)``, loops ``i, j, k``, reads ``D(k,j)`` down a
column: a cache line per multiply-add, and a dependent chain the hardware cannot run ahead
of), and a loop outside its variables reads it again and again (``i``: once per row of
``B``), its levels are put in loop order (``D`` as ``D(j,k)``), so the innermost loop reads
it front to back. The copy costs one pass over the array per call; the loops and the
additions are unchanged (the dots pass may then sum the now contiguous inner loop on vector
lanes, which reorders each sum: `sparsec/passes/dots.py`).

Cost model of the re-layout: each converted read costs a re-pack, O(nnz log nnz) of its
tensor, and nnz is not known when the kernel is built; so sets are tried by increasing
number of converted reads, and among sets of one size the later reads first (the first
operand keeps its layout, as a user writes the operand that drives the loop first). Dense
operands never constrain the order (they are located), so they are never converted.
Whether a set works is asked of the schedule itself (`schedule.every_loop`: the loop order
search that the lowering runs on, sums as a sequence included), never predicted here; only
its `OrderConflict` counts as "does not fit".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from itertools import combinations
from typing import assert_never

from ..base.errors import SparsecError
from ..frontend.concrete import concretize
from ..frontend.notation import Access, BinOp, Call, Expr, Literal, Neg, accesses
from ..frontend.semirings import semiring
from ..tensors.formats import Compressed, Dense, Format, LevelFormat, dense
from .order import OrderConflict, reordered
from .schedule import every_loop, natural_loops
from .spec import Derived, Folded, Spec, TensorVar

#: the lowering's loop order search for a spec (raises `OrderConflict` when none fits)
Probe = Callable[[Spec], tuple[str, ...]]

#: at most this many sparse reads are considered for a re-layout (2^n sets at worst)
MAX_CANDIDATES = 8


def derive(spec: Spec, lower_serially: Callable[[Spec], object] | None) -> Spec:
    """``spec`` with its repeated-index accesses made derived inputs and, when
    ``lower_serially`` is given and `schedule.every_loop` refuses every loop order, the
    cheapest set of sparse reads re-laid out so that it accepts one (`every_loop` asks
    ``lower_serially`` where a nested sum fits no order). Without it (a user schedule,
    whose refusals stand), or when no set helps, only the repeated indices change (the
    lowering then reports the conflict as before)."""
    reads = list(accesses(spec.assignment.rhs))
    feeds = {
        n: diagonal_format(spec.tensor(a.name).format, a.indices)
        for n, a in enumerate(reads)
        if len(set(a.indices)) < len(a.indices)
    }
    made = _build(spec, feeds) if feeds else spec
    if lower_serially is None:
        return made

    def probe(trial: Spec) -> tuple[str, ...]:
        return every_loop(trial, lower_serially)

    try:
        probe(made)
        return made
    except OrderConflict:
        pass
    except SparsecError:
        return made  # another refusal: the lowering reports it, as before
    candidates = [
        n
        for n, a in enumerate(reads)
        if not spec.tensor(a.name).is_dense and len(set(a.indices)) > 1
    ][:MAX_CANDIDATES]
    for size in range(1, len(candidates) + 1):
        for subset in combinations(reversed(candidates), size):
            found = _try(spec, probe, reads, feeds, subset)
            if found is not None:
                return found
    return made


def contiguous(spec: Spec) -> Spec:
    """``spec`` with each dense read that its innermost loop strides, and that loops outside
    its variables read again, fed from a copy with its levels in loop order (the module's
    third kind); ``spec`` itself when none qualifies or the loop order would change."""
    try:
        order = natural_loops(spec)
    except SparsecError:
        return spec  # the lowering reports it
    if not order:
        return spec
    inner = order[-1]
    derived = {d.name for d in spec.derived}
    feeds: dict[int, Format] = {}
    for n, read in enumerate(accesses(spec.assignment.rhs)):
        if read.name in derived or len(set(read.indices)) < len(read.indices):
            continue
        fmt = spec.tensor(read.name).format
        if not fmt.is_dense or fmt.order < 2 or inner not in read.indices:
            continue
        levels = [read.indices[m] for m in fmt.ordering]
        if levels[-1] == inner or set(order) <= set(read.indices):
            continue  # read front to back already, or once in all (no reuse to gain)
        if any(v not in order for v in read.indices):
            continue
        by_loop = sorted(range(fmt.order), key=lambda m: order.index(read.indices[m]))
        feeds[n] = Format(fmt.levels, tuple(by_loop))
    if not feeds:
        return spec
    trial = _build(spec, feeds)
    try:
        return trial if natural_loops(trial) == order else spec
    except SparsecError:
        return spec


def _same_entries(fmt: Format) -> Format:
    """``fmt`` as a copy of a re-laid-out read may store it: every dense level below a
    sparse one made compressed, and every singleton chain too. A dense level under a sparse
    parent stores every coordinate of each stored parent (zeros included, present to the
    lattice); moved to another mode by a re-layout it would make entries present that the
    caller's tensor never stored (``0 * inf`` where the original had no term). A singleton
    holds one coordinate per parent position, which the entries of another mode order need
    not have (ELL's ``ddp`` re-laid out as ``ddp:1,0,2``), and a non-unique level exists
    for the singletons below it: both become compressed (unique) levels, which hold any
    pattern. The copy holds exactly the caller's stored entries, explicit zeros included."""
    levels: list[LevelFormat] = []
    sparse_above = False
    for level in fmt.levels:
        if not isinstance(level, Dense) or sparse_above:
            level = Compressed()
        sparse_above = sparse_above or not isinstance(level, Dense)
        levels.append(level)
    return Format(tuple(levels), fmt.ordering)


def _try(
    spec: Spec,
    probe: Probe,
    reads: list[Access],
    feeds: Mapping[int, Format],
    subset: tuple[int, ...],
) -> Spec | None:
    """``spec`` with the reads ``subset`` re-laid out, if the lowering then finds an order:
    the order comes from the other operands (the subset's reads located, as dense), and
    each read of the subset gets its levels in that order (`order.reordered`)."""
    width = {n: len(set(reads[n].indices)) for n in subset}
    loose = _build(spec, {**feeds, **{n: dense(width[n]) for n in subset}})
    try:
        order = probe(loose)
    except SparsecError:
        return None
    chosen = dict(feeds)
    for n in subset:
        read = reads[n]
        base = feeds.get(n) or spec.tensor(read.name).format
        distinct = tuple(dict.fromkeys(read.indices))
        chosen[n] = _same_entries(reordered(Access(read.name, distinct), base, order))
    trial = _build(spec, chosen)
    try:
        probe(trial)
    except SparsecError:
        return None
    return trial


def diagonal_format(source: Format, indices: tuple[str, ...]) -> Format:
    """The format of ``source`` read as ``indices`` with each variable once: one level per
    distinct variable, in the order of its first level in ``source``; compressed where
    any of its levels iterates positions (presence stays "the source stores it"), dense
    otherwise. With no repeated variable, ``source`` itself."""
    if len(set(indices)) == len(indices):
        return source
    distinct = tuple(dict.fromkeys(indices))
    level_vars = [indices[mode] for mode in source.ordering]
    by_level = sorted(distinct, key=level_vars.index)
    levels = tuple(
        Compressed()
        if any(
            lf.position_iteration
            for lf, v in zip(source.levels, level_vars, strict=True)
            if v == var
        )
        else Dense()
        for var in by_level
    )
    return Format(levels, tuple(distinct.index(v) for v in by_level))


def _build(spec: Spec, feeds: Mapping[int, Format]) -> Spec:
    """``spec`` with each right-hand read numbered in ``feeds`` (source order) replaced by
    a derived input in that format; reads of one tensor with the same indices and format
    share one."""
    reads = list(accesses(spec.assignment.rhs))
    taken = {t.name for t in spec.tensors}
    names: dict[int, str] = {}
    shared: dict[tuple[str, tuple[str, ...], Format], str] = {}
    derived: list[Derived] = []
    for n in sorted(feeds):
        read, fmt = reads[n], feeds[n]
        key = (read.name, read.indices, fmt)
        if key not in shared:
            tag = "diag" if len(set(read.indices)) < len(read.indices) else "as"
            name = next(
                c
                for k in range(len(taken) + 1)
                if (c := f"{read.name}_{tag}{k or ''}") not in taken
            )
            taken.add(name)
            shared[key] = name
            derived.append(Derived(name, spec.tensor(read.name), read.indices, fmt))
        names[n] = shared[key]
    counter = iter(range(len(reads)))
    assignment = replace(spec.assignment, rhs=_rename(spec.assignment.rhs, names, counter))
    var = {t.name: t for t in spec.tensors}
    for d in derived:
        var[d.name] = TensorVar(d.name, len(d.distinct), d.format, False, d.source.argument)
    used = dict.fromkeys(a.name for a in assignment.accesses())
    before = {a.name for a in spec.assignment.accesses()}
    # tensors outside the statement (a mask) stay; a tensor read only through derived
    # inputs is passed by the caller (`Derived.source`) but is no kernel parameter
    extra = tuple(t for t in spec.tensors if t.name not in before)
    tensors = tuple(var[n] for n in used) + extra
    indices = tuple(dict.fromkeys(i for a in assignment.accesses() for i in a.indices))
    return replace(
        spec,
        assignment=assignment,
        statement=concretize(assignment, semiring(spec.semantics.semiring).distributive),
        tensors=tensors,
        indices=indices,
        derived=spec.derived + tuple(derived),
    )


def _rename(expr: Expr, names: Mapping[int, str], counter: Iterator[int]) -> Expr:
    """``expr`` with the ``n``-th access (source order) reading ``names[n]`` on its
    distinct variables."""
    match expr:
        case Access():
            n = next(counter)
            if n not in names:
                return expr
            first = [expr.indices.index(v) for v in dict.fromkeys(expr.indices)]
            spans = tuple(expr.index_spans[m] for m in first) if expr.index_spans else ()
            indices = tuple(expr.indices[m] for m in first)
            # a mask's re-layout stays the mask (~M stays ~)
            return Access(names[n], indices, expr.span, spans, expr.complement, expr.pattern)
        case Literal():
            return expr
        case Neg(operand=x):
            return replace(expr, operand=_rename(x, names, counter))
        case BinOp(left=left, right=right):
            renamed = _rename(left, names, counter)
            return replace(expr, left=renamed, right=_rename(right, names, counter))
        case Call(args=args):
            return replace(expr, args=tuple(_rename(a, names, counter) for a in args))
        case _:
            assert_never(expr)


def describe(spec: Spec) -> str:
    """The derived inputs in words, for the kernel's header and `Kernel.schedule` ("" when
    there are none)."""
    said = []
    for d in spec.derived:
        if isinstance(d, Folded):
            said.append(_describe_fold(d))
            continue
        src = d.source
        read = f"{src.name}({','.join(d.indices)})"
        into = f"{d.name}({','.join(d.distinct)}) ({d.format})"
        if src.format.is_dense and len(d.distinct) == len(d.indices):
            said.append(
                f"{read} reads {into}: {src.name} transposed at call time, so that the "
                "innermost loop reads it contiguously (one pass over it per call)"
            )
        elif len(d.distinct) < len(d.indices):
            repeated = sorted({v for v in d.indices if d.indices.count(v) > 1})
            said.append(
                f"{read} reads the entries of {src.name} with equal {', '.join(repeated)} "
                f"coordinates, filtered at call time into {into} (O(nnz))"
            )
        else:
            said.append(
                f"{read} reads {into}: {src.name} ({src.format}) converted at call time, as "
                "no loop order fits its levels with the other reads' (O(nnz); kept on a "
                "sparsec.Tensor)"
            )
    return "; ".join(said)


def _describe_fold(d: Folded) -> str:
    reads = [f"{f.source.name}({','.join(f.indices)})" for f in d.factors]
    if d.factors[0].divides:
        combined = " * ".join(reads)
    else:
        combined = reads[0] + "".join(
            f" {'/' if f.divides else '*'} {r}"
            for f, r in zip(d.factors[1:], reads[1:], strict=True)
        )
    return (
        f"{combined} regrouped into {d.name}({','.join(d.distinct)}) ({d.format}), computed "
        f"once per call (O({'*'.join(d.distinct)})) instead of at every entry it scales"
    )
