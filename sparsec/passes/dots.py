"""Dot reductions on vector lanes: a serial loop that only sums contiguous reads into scalars.

SDDMM's inner loop, ``acc += dY[o*T + t] * X[i*T + t]`` over a dense ``t``, and every sum
over a dense level read in storage order (a dense GEMV row, a row sum over a compressed
level's values) is one chain of dependent additions: each add waits for the one before it,
so the loop runs at the adder's latency, a term every 4 cycles, and C compilers do not
reorder floating-point sums on their own. This pass lets the compiler sum on vector lanes:
the loop is cut into blocks of ``dot_block`` iterations (`policy.decision`), each block
summed into a partial of the value type under ``#pragma omp simd reduction(+: ...)``, and
each partial added into the loop's accumulator. A float32 partial sums at most
``dot_block`` terms, at most ``dot_block / lanes`` per lane, and is then added into the
double accumulator (``sc_acc_t``), so float32 sums keep the precision docs/decisions.md
records for them ("float32 sums accumulate in double").

A *dot loop* is a `For` that

- runs serially (no parallel unit, no unroll request), not inside a vector loop, and nests
  nothing: its body is declarations, ``acc += value`` into scalars declared outside it and
  ``flag = 1`` (the "reached" marks of a sparse output, declared 0; set once before the
  blocks when the loop runs at all, since every iteration sets them);
- reads every array at an index whose stride in the loop variable is 0 (the same element
  each iteration) or 1 (the next element): no gather (``x[crd[p]]``) and no strided walk,
  which vector lanes would serve with gathers;
- reads at least one array with stride 1;
- may run more than ``dot_fixed`` iterations (`PassOptions`: a short loop of constant
  bounds, a block's row, is unrolled by the C compiler instead).

Only the order of the additions changes: which terms are summed, and that a NaN or
infinity among them makes the sum NaN or infinite, does not. torch and TACO (whose
generated code is compiled with ``-ffast-math``) reorder such sums too. Semirings are left
alone (`run_passes` runs no pass under them). C only.

Value-typed partials of ``dot_block`` terms added into the double accumulator measured fastest,
ahead of lanes summing in double (docs/decisions.md, "Contiguous dot loops"). A dot loop of
at most ``dot_fixed`` iterations fixed in the code (a bsr block's row) is left to the C
compiler to unroll, its terms summed into value-typed partials (`_partial`), so that a
float32 term is not converted to the double accumulator one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ..ir import nodes as ir
from ..ir.visit import (
    bindings,
    exprs,
    free_vars,
    map_blocks,
    statements,
    subexpressions,
    substitute,
)
from ..middle.commands import Unit
from ..policy.decision import DEFAULTS, PassOptions


def vectorize_dots(
    body: ir.Block, options: PassOptions = DEFAULTS
) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every dot loop summed on vector lanes in blocks of
    ``options.dot_block`` iterations, and a note when any was."""
    block = options.dot_block
    decls = [s for s in statements(body) if isinstance(s, ir.Decl)]
    scalars = {d.name for d in decls if d.type in (ir.ACC, ir.VAL)}
    # flags declared 0: set before the loop when it runs, as its iterations would
    flags = {d.name for d in decls if d.type == ir.BOOL and d.init == ir.IntLit(0)}
    count = [0, 0]
    done = _block(body, count, (scalars, flags), False, (block, options.dot_fixed))
    notes = []
    if count[0]:
        notes.append(f"{count[0]} dot loop(s) summed on vector lanes in blocks of {block}")
    if count[1]:
        notes.append(f"{count[1]} short dot loop(s) summed into value-typed partials")
    return (done, tuple(notes)) if notes else (body, ())


#: the names a dot loop may sum into, and the flags it may set
Names = tuple[set[str], set[str]]


#: (``dot_block``, ``dot_fixed``) of the `PassOptions`
Sizes = tuple[int, int]


def _block(b: ir.Block, count: list[int], names: Names, in_vector: bool, size: Sizes) -> ir.Block:
    out: list[ir.Stmt] = []
    for s in b.body:
        if isinstance(s, ir.For) and not in_vector:
            sums = _dot(s)
            if sums is not None and set(sums[0]) <= names[0] and set(sums[1]) <= names[1]:
                uid = count[0] + count[1] + 1
                if _short(s, size[1]):
                    count[1] += 1
                    out.extend(_partial(s, sums[0], uid))
                else:
                    count[0] += 1
                    out.extend(_blocked(s, *sums, uid=uid, size=size[0]))
                continue
        vector = in_vector or (
            isinstance(s, ir.For) and s.parallel is not None and s.parallel.unit == Unit.CPUVector
        )
        out.append(map_blocks(s, _inside(count, names, vector, size)))
    return ir.Block(tuple(out))


def _inside(
    count: list[int], names: Names, in_vector: bool, size: Sizes
) -> Callable[[ir.Block], ir.Block]:
    return lambda b: _block(b, count, names, in_vector, size)


def _dot(loop: ir.For) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the accumulators, the flags) of a dot loop, or None when ``loop`` is not one."""
    if loop.parallel is not None or loop.unroll:
        return None
    local: set[str] = set()
    sums: list[str] = []
    flags: list[str] = []
    values: list[ir.Expr] = []
    for s in loop.body.body:
        match s:
            case ir.Decl(init=init) if init is not None:
                local.add(s.name)
            case ir.Assign(target=ir.Var(name=name), op="+=", atomic=False) if name not in local:
                if name not in sums:
                    sums.append(name)
                values.append(s.value)
            case ir.Assign(target=ir.Var(name=name), value=ir.IntLit(value=1), op="=") if (
                name not in local
            ):
                if name not in flags:
                    flags.append(name)
            case ir.Comment():
                pass
            case _:
                return None
    if not sums or set(sums) & set(flags):
        return None
    written = set(sums) | set(flags)
    env = bindings(loop.body.body)
    seen_stride_one = False
    for s in loop.body.body:
        for e in exprs(s):
            full = substitute(e, env)
            if free_vars(full) & written and not isinstance(s, ir.Assign):
                return None  # a position computed from an accumulator
            for x in subexpressions(full):
                if isinstance(x, ir.Load):
                    step = _stride(x.index, loop.var)
                    if step not in (0, 1):
                        return None
                    seen_stride_one |= step == 1
    if any(free_vars(substitute(v, env)) & written for v in values):
        return None  # a term reads an accumulator: the iterations depend on each other
    return (tuple(sums), tuple(flags)) if seen_stride_one else None


def _short(loop: ir.For, fixed: int) -> bool:
    """Does ``loop`` run at most ``fixed`` iterations, known when the kernel is generated
    (a block's row of a bsr(R,C) tensor, `Spec.static`)? The C compiler unrolls it: its
    chain of additions is short, and blocks of lanes wider than it would never run; it is
    summed into value-typed partials (`_partial`), not on lanes."""
    start, end = loop.start, loop.end
    if isinstance(start, ir.IntLit) and isinstance(end, ir.IntLit):
        return end.value - start.value <= fixed
    return False


def _stride(e: ir.Expr, var: str) -> int | None:
    """The constant step of ``e`` per iteration of the loop over ``var`` (0: the same
    value every iteration), or None when it is not affine in ``var`` with a constant step
    (a load whose index moves: a gather)."""
    match e:
        case ir.Var(name=name):
            return 1 if name == var else 0
        case ir.IntLit() | ir.FloatLit():
            return 0
        case ir.Bin(op="+" | "-", left=a, right=b):
            sa, sb = _stride(a, var), _stride(b, var)
            if sa is None or sb is None:
                return None
            return sa + sb if e.op == "+" else sa - sb
        case ir.Bin(op="*", left=a, right=b):
            sa, sb = _stride(a, var), _stride(b, var)
            if sa == 0 and sb == 0:
                return 0
            if sa == 0 and isinstance(a, ir.IntLit) and sb is not None:
                return a.value * sb
            if sb == 0 and isinstance(b, ir.IntLit) and sa is not None:
                return b.value * sa
            return None
        case ir.Unary(op="-", operand=x):
            sx = _stride(x, var)
            return None if sx is None else -sx
        case _:
            # a load, call, select or other operator: invariant when nothing in it moves
            return None if var in free_vars(e) else 0


def _blocked(
    loop: ir.For, sums: tuple[str, ...], flags: tuple[str, ...], uid: int, size: int
) -> list[ir.Stmt]:
    """``loop`` as blocks of ``size`` iterations, each summed on vector lanes into partials
    of the value type, which are added into ``sums``. The names it declares are the
    ``sc_`` ones no index or tensor can take, numbered ``uid`` per kernel."""
    v = loop.var
    blk, lo, hi = f"sc_dot{uid}", f"sc_dot{uid}_lo", f"sc_dot{uid}_hi"
    parts = {name: f"sc_dot{uid}_part{n}" for n, name in enumerate(sums)}
    start = ir.Var(f"sc_dot{uid}_start")
    count = ir.Bin("/", ir.add(ir.Bin("-", loop.end, start), ir.IntLit(size - 1)), ir.IntLit(size))
    inner_body = _into_parts((s for s in loop.body.body if not _sets_flag(s, flags)), parts)
    inner = ir.For(
        v,
        ir.Var(lo),
        ir.Var(hi),
        ir.Block(inner_body),
        parallel=ir.Parallel(Unit.CPUVector, reduction=tuple(parts.values())),
    )
    block = ir.block(
        ir.Decl(ir.I64, lo, ir.add(start, ir.Bin("*", ir.Var(blk), ir.IntLit(size)))),
        ir.Decl(ir.I64, hi, ir.Call("min", (loop.end, ir.add(ir.Var(lo), ir.IntLit(size))))),
        *(ir.Decl(ir.VAL, part, ir.FloatLit(0.0)) for part in parts.values()),
        inner,
        *(ir.Assign(ir.Var(name), ir.Var(part), "+=") for name, part in parts.items()),
    )
    # every iteration sets the flags: they are set once before the loop when it runs at
    # all, rather than combined by `max` on the lanes (that reduction cost SDDMM's jammed
    # dot loops a good part of their -O3 compile: docs/decisions.md, "A cold compile's time")
    ran = ir.If(
        (
            (
                ir.Bin("<", start, loop.end),
                ir.Block(tuple(ir.Assign(ir.Var(f), ir.IntLit(1)) for f in flags)),
            ),
        )
    )
    return [
        ir.Decl(ir.I64, start.name, loop.start),
        *((ran,) if flags else ()),
        ir.For(blk, ir.IntLit(0), count, block),
    ]


def _partial(loop: ir.For, sums: tuple[str, ...], uid: int) -> list[ir.Stmt]:
    """A short dot loop (`_short`) as it is, its terms summed into partials of the value
    type, each added into its accumulator once after it: a float32 block's row then
    multiplies and adds in float (the C compiler unrolls it into vector operations) and
    converts to the double accumulator once, not at every term (a partial of at most
    ``dot_fixed`` terms, within the ``dot_block`` bound the precision rule allows)."""
    parts = {name: f"sc_dot{uid}_part{n}" for n, name in enumerate(sums)}
    return [
        *(ir.Decl(ir.VAL, part, ir.FloatLit(0.0)) for part in parts.values()),
        replace(loop, body=ir.Block(_into_parts(loop.body.body, parts))),
        *(ir.Assign(ir.Var(name), ir.Var(part), "+=") for name, part in parts.items()),
    ]


def _into_parts(stmts: Iterable[ir.Stmt], parts: dict[str, str]) -> tuple[ir.Stmt, ...]:
    """``stmts`` with each sum into an accumulator of ``parts`` made into its partial."""
    return tuple(
        replace(s, target=ir.Var(parts[s.target.name]))
        if isinstance(s, ir.Assign) and isinstance(s.target, ir.Var) and s.target.name in parts
        else s
        for s in stmts
    )


def _sets_flag(s: ir.Stmt, flags: tuple[str, ...]) -> bool:
    return isinstance(s, ir.Assign) and isinstance(s.target, ir.Var) and s.target.name in flags
