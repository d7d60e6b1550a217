"""Default schedules: what sparsec decides when the user names no schedule, as explicit
commands, and how the schedule that ran is told in words.

The GPU default is a list of candidate mappings, best first, each a tuple of `Command`s
(TACO's scheduling language) decided from the spec and its concordant loop order alone;
the pipeline lowers each candidate once and keeps the first that the lowerer accepts. The
CPU default (`cpu_default`) is one ``parallelize`` of the outermost loop, or none, appended
to the user's commands; `describe_cpu` tells what ran.
"""

from __future__ import annotations

from collections.abc import Callable

from ..frontend.concrete import accesses, exact
from ..frontend.notation import Access, factors
from ..middle.commands import Command, name_supply
from ..middle.lattice import Iterator, Lattice, build
from ..middle.order import level_indices
from ..middle.spec import Spec
from ..tensors.layout import OutputLayout

#: threads per block of the thread-per-row and nonzero mappings
THREADS_PER_BLOCK = 256
#: nonzeros per thread of the nonzero mapping (TACO's GPU MTTKRP)
NONZEROS_PER_THREAD = 8
#: coordinates per thread of a merge of sparse levels at the outermost loop
COORDS_PER_THREAD = 8


def _cmd(name: str, *args: object) -> Command:
    return Command(name, tuple(str(a) for a in args))


def gpu_candidates(spec: Spec, order: tuple[str, ...]) -> list[tuple[Command, ...]]:
    """Candidate GPU mappings of loop ``order``, best first.

    A sparse operand of order three or more whose levels are the outermost loops is
    iterated over its nonzeros (TACO's GPU MTTKRP: fuse its levels, ``pos``, 8 nonzeros per
    thread and 256 threads per block, atomics where the output is shared), since its slices
    are too uneven for a thread each. Next, when the outermost and innermost loops both
    index the output and the innermost is dense in every operand (SpMM's ``i`` and ``j``):
    an output row per block and its columns across the block's threads, the innermost loop
    moved second, so a warp's loads and stores are contiguous. Otherwise, thread-per-row
    over the outermost loop: a plain range, or a sparse operand's positions; with atomics
    when that loop's iterations share output elements. Where sparse operands meet at the
    outermost loop (a merge, or a sparse operand in a sum with a dense one) and no ``pos``
    applies, the loop is split as a merge (`sparsec.lower.window`): 8 coordinates per
    thread when every term needs a sparse operand, else one coordinate per thread; each
    thread finds its operands' first positions by a binary search.
    """
    if not order:
        return []
    v = order[0]
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})

    candidates: list[tuple[Command, ...]] = []
    for access in dict.fromkeys(accesses(spec.statement.rhs)):
        fmt = spec.tensor(access.name).format
        levels = level_indices(access, fmt)
        if fmt.is_dense or len(levels) < 3 or tuple(order[: len(levels)]) != levels:
            continue
        commands, fused = [], levels[0]
        for var in levels[1:]:
            joint = fresh("f")
            commands.append(_cmd("fuse", fused, var, joint))
            fused = joint
        fp, b, rest, t, n = (
            fresh("fpos"),
            fresh("block"),
            fresh("fpos1"),
            fresh("thread"),
            fresh("nz"),
        )
        commands += [
            _cmd("pos", fused, fp, access.name),
            _cmd("split", fp, b, rest, NONZEROS_PER_THREAD * THREADS_PER_BLOCK),
            _cmd("split", rest, t, n, NONZEROS_PER_THREAD),
            _cmd("parallelize", b, "GPUBlock", "Atomics"),
            _cmd("parallelize", t, "GPUThread", "Atomics"),
        ]
        candidates.append(tuple(commands))
        break
    last = order[-1]
    sparse_inputs = [tv.name for tv in spec.inputs if not tv.format.is_dense]
    out_indices = set(spec.statement.lhs.indices)
    if (
        len(order) >= 2
        and {v, last} <= out_indices
        and not any(last in _indices_of(spec, name) for name in sparse_inputs)
    ):
        # an output row per block, its dense columns across the block's threads: the
        # threads of a warp read and write consecutive elements (coalesced)
        rows = [_cmd("reorder", v, last, *order[1:-1])] if len(order) > 2 else []
        rows += [_cmd("parallelize", v, "GPUBlock", "NoRaces")]
        rows += [_cmd("parallelize", last, "GPUThread", "NoRaces")]
        candidates.append(tuple(rows))
    b, t, p = fresh(f"{v}_block"), fresh(f"{v}_thread"), fresh(f"{v}_pos")
    sparse = [
        tv.name for tv in spec.inputs if not tv.format.is_dense and v in _indices_of(spec, tv.name)
    ]
    lattice = _outer_lattice(spec, v)
    # sparse operands meet at v: a pos over one of them (the others located) first; else
    # a split of the merge (`lower.window`), in chunks of coordinates per thread when no
    # dense term needs every coordinate
    meet = bool(lattice.iterators) and not lattice.position_loop
    chunk, c = fresh(f"{v}_chunk"), fresh(f"{v}_in")
    for races in ("NoRaces", "Atomics"):
        tail = (
            _cmd("parallelize", b, "GPUBlock", races),
            _cmd("parallelize", t, "GPUThread", races),
        )
        plain = (_cmd("split", v, b, t, THREADS_PER_BLOCK), *tail)
        positions = [
            (_cmd("pos", v, p, name), _cmd("split", p, b, t, THREADS_PER_BLOCK), *tail)
            for name in sparse
        ]
        if not meet:
            candidates += [plain, *positions]
            continue
        candidates += positions
        if not lattice.full:
            per_thread = COORDS_PER_THREAD
            candidates.append(
                (
                    _cmd("split", v, b, chunk, per_thread * THREADS_PER_BLOCK),
                    _cmd("split", chunk, t, c, per_thread),
                    *tail,
                )
            )
        candidates.append(plain)
    return candidates


def vector_schedule(
    row: str,
    col: str,
    tensor: str,
    lanes: int,
    fresh: Callable[[str], str] | None = None,
    width: int = 32,
) -> tuple[Command, ...]:
    """CSR-vector: each row of loop ``row`` taken by a group of ``lanes`` lanes of a warp
    of ``width`` lanes (`Target.lanes`: 2, 4, 8, 16 or 32 on CUDA), whose lanes stride over
    ``tensor``'s positions of ``col`` and add their parts by shuffles within the group; 256
    threads per block. Under a whole warp the rows are split into the warp's groups
    (`lower.gpu_loops`): ``split(row, b, rows, 8 * R), split(rows, warp, group, R)`` with
    R = width / lanes, ``group`` a GPUThread loop over the warp's groups and the positions
    a GPUThread loop over a group's lanes."""
    name = fresh or (lambda base: base)
    b, rows, warp, group = (name(f"{row}_{part}") for part in ("block", "rows", "warp", "group"))
    p = name(f"{col}_pos")
    warps = THREADS_PER_BLOCK // width
    per_warp = width // lanes
    head = [_cmd("pos", col, p, tensor)]
    tail = [
        _cmd("parallelize", b, "GPUBlock", "NoRaces"),
        _cmd("parallelize", warp, "GPUWarp", "NoRaces"),
    ]
    if per_warp == 1:
        head.insert(0, _cmd("split", row, b, warp, warps))
    else:
        head[:0] = [
            _cmd("split", row, b, rows, warps * per_warp),
            _cmd("split", rows, warp, group, per_warp),
        ]
        tail.append(_cmd("parallelize", group, "GPUThread", "NoRaces"))
    return (*head, *tail, _cmd("parallelize", p, "GPUThread", "ParallelReduction"))


#: the GPU default's lanes per row (CSR-vector) for rows of this many nonzeros on average
#: or more: thread-per-row below (see `vector_lanes`)
VECTOR_MIN_ROW = 4


def vector_rows(spec: Spec) -> tuple[str, str, str] | None:
    """(row, col, tensor) where the GPU default may give each row a group of lanes
    (`vector_schedule`; the lanes are chosen per call by `vector_lanes`): an SpMV-like
    kernel, a dense output over ``row`` alone, a product of one CSR-like operand (a dense
    level over ``row``, then a compressed unique level over ``col``) and dense operands
    over ``col``, reduced over ``col``. Else None (the default stays as is)."""
    lhs = spec.statement.lhs
    if len(lhs.indices) != 1 or not spec.output.format.is_dense:
        return None
    parts = factors(spec.statement.rhs)
    found = [a for a in parts if isinstance(a, Access) and not spec.tensor(a.name).format.is_dense]
    if len(found) != 1 or found[0].complement:
        return None
    (access,) = found
    fmt = spec.tensor(access.name).format
    levels = level_indices(access, fmt)
    if len(levels) != 2 or levels[0] != lhs.indices[0] or levels[1] in lhs.indices:
        return None
    row, col = levels
    others = [a for a in parts if isinstance(a, Access) and a is not access]
    if any(set(a.indices) - {col} for a in others):
        return None
    first, second = fmt.levels
    if first.position_iteration or not second.position_iteration or not second.unique:
        return None
    return row, col, access.name


def vector_lanes(average: float, width: int = 32) -> int:
    """Lanes per row for rows of ``average`` nonzeros: 0 (thread-per-row) under
    `VECTOR_MIN_ROW`, else the largest power of two at most half the average, up to a
    warp of ``width`` lanes: each lane loads two or more of the row's nonzeros. Measured on an H200 (``python
    -m bench.gpu_lanes``, rows of 2 to 128 nonzeros): this is the fastest group size, or
    close to it, at every length; a group as large as the average (the rule before) was
    slower from 8 to 32 per row (docs/decisions.md, "GPU SpMV's lane groups")."""
    if not average >= VECTOR_MIN_ROW:
        return 0
    return min(width, 1 << (int(average / 2).bit_length() - 1))


def cpu_default(
    spec: Spec, order: tuple[str, ...], commands: tuple[Command, ...] = ()
) -> tuple[Command, ...]:
    """The CPU default as explicit commands, appended to the user's ``commands`` (none
    when they parallelize a loop themselves): the outermost loop of ``order`` (the loop
    order under ``commands``, outermost first) on CPU threads, or nothing.

    - a loop over an output index writes its own output elements: ``NoRaces``;
    - a scalar output is summed with an OpenMP reduction: ``ParallelReduction``;
    - otherwise the iterations share output elements: ``Temporary``, each thread adds into
      its own copy of the output (serially into the output when the copies would be too
      large). On a loop of a schedule's space, whose race the lowerer's analysis decides,
      ``Temporary`` also covers the race-free case: a strategy applies to races only;
    - a sparse output is appended in one sequence, so only its row loop runs in
      parallel, and only when a dense level holds the rows (``NoRaces``; e.g. csr);
    - a while loop (a merge of sparse levels, or runs of a non-unique level) and a loop
      the user unrolls stay serial.

    The commands are marked ``policy``: the lowerer words them as the default's and leaves
    the loop serial where a precompute's workspace encloses it (that placement is the
    lowerer's); a user's command there is an error.
    """
    if not order or any(c.name == "parallelize" for c in commands):
        return ()
    v = order[0]
    # an OpenMP pragma must be the last before its loop, as must GCC's unroll
    if any(c.name == "unroll" and c.args[0] == v for c in commands):
        return ()
    stmt = spec.statement
    lhs = stmt.lhs
    space = v not in stmt.loop_indices  # split, divide, pos, fuse or bound made it
    if not space and not _for_loop(spec, v):
        return ()
    if not spec.output.format.is_dense:
        rowwise = OutputLayout.of(spec.output.format, spec.output.name).rowwise
        return (_default(v, "NoRaces"),) if rowwise and v in lhs.indices else ()
    if not lhs.indices:
        return (_default(v, "ParallelReduction"),)
    return (_default(v, "Temporary" if space or v not in lhs.indices else "NoRaces"),)


def _default(var: str, races: str) -> Command:
    return Command("parallelize", (var, "CPUThread", races), policy=True)


def _for_loop(spec: Spec, var: str) -> bool:
    """Whether the outermost loop, over ``var``, is a for loop: a dense range, or one
    operand's unique level's positions (the merge lattice of the right-hand side at
    ``var`` has one point with at most one iterator); not a merge or a walk over runs of
    equal coordinates. The lattice's `range_loop` / `position_loop` are the shapes the
    co-iteration emitter dispatches on, so the two cannot disagree. An expression with no
    point at ``var`` has no loop at all."""
    lattice = _outer_lattice(spec, var)
    if lattice.range_loop:
        return True
    if not lattice.position_loop:
        return False
    (it,) = lattice.iterators
    return spec.tensor(it.access.name).format.levels[0].unique


def _outer_lattice(spec: Spec, var: str) -> Lattice:
    """The merge lattice of the right-hand side at the outermost loop, over ``var``: an
    iterator for each operand whose first level holds ``var`` and iterates positions."""
    rhs = spec.statement.rhs

    def first_level(access: Access) -> Iterator | None:
        fmt = spec.tensor(access.name).format
        if level_indices(access, fmt)[:1] != (var,) or not fmt.levels[0].position_iteration:
            return None
        return Iterator(access, 0)

    return build(rhs, first_level, exact(rhs, spec.semantics.division))


def _indices_of(spec: Spec, tensor: str) -> set[str]:
    return {i for a in accesses(spec.statement.rhs) if a.name == tensor for i in a.indices}


def _spelled(commands: tuple[Command, ...]) -> str:
    return ", ".join(str(c) for c in commands)


def describe_gpu(commands: tuple[Command, ...], default: bool, notes: tuple[str, ...]) -> str:
    """The GPU mapping that ran, in words: the user's or the default's commands, then the
    lowerer's and the passes' notes."""
    description = ("default: " if default else "user: ") + _spelled(commands)
    return f"{description}; {'; '.join(notes)}" if notes else description


def describe_cpu(
    spec: Spec,
    parallel: bool,
    loops: tuple[str, ...],
    order: tuple[str, ...],
    commands: tuple[Command, ...] = (),
    notes: tuple[str, ...] = (),
) -> str:
    """The CPU schedule that ran, in words (header comment and `Kernel.schedule`):
    ``commands`` are the user's (`cpu_default`'s are told as the default), ``loops`` the
    loops the lowerer ran on CPU threads, ``notes`` how each runs."""
    if commands:
        user = _spelled(commands)
        if not parallel:
            return f"user: {user}; serial (requested)"
        if notes:
            return f"user: {user}; parallel: {'; '.join(notes)}"
        if loops:
            return (
                f"user: {user}; default parallel loop {', '.join(loops)} (OpenMP dynamic, "
                "~8 chunks per thread)"
            )
        return f"user: {user}; serial (no loop parallelized)"
    if not parallel:
        return "serial (requested)"
    if not spec.output.format.is_dense and not loops:
        return "default: serial (a sparse output is appended in one sequence)"
    if loops:
        how = f" ({'; '.join(notes)})" if notes else ""
        return (
            f"default: loop {', '.join(loops)} runs on CPU threads "
            f"(OpenMP dynamic, ~8 chunks per thread){how}; inner loops serial"
        )
    first = order[0] if order else None
    why = (
        f"the outermost loop ({first}) is not a plain loop over an output index"
        if first
        else "there are no loops"
    )
    return f"default: serial, since {why}"
