"""A kernel's parallel loop with its rows in a function of their own (C target).

GCC compiles an OpenMP loop's body into an outlined function whose arguments are the
shared variables, and the ``restrict`` of the kernel's parameters does not reach it: in
there every store may alias every array, so values are reloaded after each store and
short fixed loops are not vectorised (a bsr(4,4) SpMV on one thread ran at half the speed
of the same loop without the pragma; docs/decisions.md). So the parallel loop's body goes
into a function of its own (`abi.ROWS_NAME`, ``static`` and never inlined, as the
template makes every function with extra parameters: its parameters are the kernel's,
``restrict`` included), which runs the rows ``[lo, hi)`` serially; the kernel's parallel
loop runs over chunks of rows, each one call, in the schedule the loop had (`dynamic`
chunks of the same size).

The pipeline moves it only in kernels whose formats fix some loop extents (`Spec.static`:
a mapped format's blocks), where it was measured to pay; on CSR SpMV it measured even,
and on one CSR kernel with a `bound` it made GCC 12's vectoriser fail (an internal
compiler error), so it is not risked there. Only a loop that the function can run alone
is moved: the kernel's first top-level CPU-thread loop, with no reduction or flags across
its iterations (OpenMP clauses), which writes no variable declared before it, reads only
integer locals declared before it (passed by value; a workspace allocated before it
stays), and returns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..abi import ROWS_NAME, Signature
from ..ir import nodes as ir
from ..ir.visit import exprs, statements, subexpressions
from ..middle.commands import Unit

#: the locals a moved loop may read, passed by value
_SCALARS = (ir.I64, ir.IDX, ir.BOOL)
#: the rows function's bounds
LO, HI = "sc_rows_lo", "sc_rows_hi"


@dataclass(frozen=True, slots=True)
class Outlined:
    """The kernel's new body, the rows function's body, and its extra parameters (the
    locals it reads, then ``lo`` and ``hi``), each as (symbolic type, name)."""

    kernel: ir.Block
    rows: ir.Block
    extra: tuple[tuple[str, str], ...]


def outline_rows(body: ir.Block, sig: Signature) -> Outlined | None:
    """``body`` with its parallel loop's rows moved into `ROWS_NAME` (see the module), or
    None where no loop qualifies."""
    at = next(
        (
            n
            for n, s in enumerate(body.body)
            if isinstance(s, ir.For)
            and s.parallel is not None
            and s.parallel.unit == Unit.CPUThread
        ),
        None,
    )
    if at is None:
        return None
    loop = body.body[at]
    assert isinstance(loop, ir.For) and loop.parallel is not None
    par = loop.parallel
    if par.reduction or par.flags or par.collapse != 1 or par.schedule not in ("dynamic", "static"):
        return None
    if any(isinstance(s, ir.Return) for s in statements(loop.body)):
        return None
    before: dict[str, ir.Stmt] = {}
    for s in body.body[:at]:
        if isinstance(s, ir.Decl | ir.Alloc | ir.Pointer):
            before[s.name] = s
    read, written, inside = _names(loop.body)
    written -= inside
    used = (read | written) - inside - {loop.var}
    if written & set(before):
        return None
    locals_used = sorted(used & set(before))
    for name in locals_used:
        decl = before[name]
        if not isinstance(decl, ir.Decl) or decl.type not in _SCALARS:
            return None
    params = {p.name for p in sig.params}
    if any(name not in params and name not in before for name in written):
        return None  # a store into something neither the kernel's nor local: keep it here
    extra = (*((before[n].type, n) for n in locals_used), (ir.I64, LO), (ir.I64, HI))  # type: ignore[union-attr]
    rows = ir.block(ir.For(loop.var, ir.Var(LO), ir.Var(HI), loop.body))
    kernel = ir.Block(
        (*body.body[:at], *_chunked(loop, par, locals_used, sig), *body.body[at + 1 :])
    )
    return Outlined(kernel, rows, extra)


def _chunked(
    loop: ir.For, par: ir.Parallel, locals_used: list[str], sig: Signature
) -> list[ir.Stmt]:
    """The kernel's loop over chunks of rows, each one call of the rows function."""
    start, end = loop.start, loop.end
    n = ir.Bin("-", end, start)
    stmts: list[ir.Stmt] = []
    if par.chunk:
        size: ir.Expr = ir.Var(par.chunk)
    else:  # static, the runtime's chunks: one per thread
        threads = ir.Var(sig.threads)
        size = ir.Call(
            "max",
            (ir.IntLit(1), ir.Bin("/", ir.add(n, ir.Bin("-", threads, ir.IntLit(1))), threads)),
        )
    chunks = "sc_rows_chunks"
    c = "sc_rows_c"
    stmts.append(
        ir.Decl(ir.I64, chunks, ir.Bin("/", ir.add(n, ir.Bin("-", size, ir.IntLit(1))), size))
    )
    lo = ir.add(start, ir.mul(ir.Var(c), size))
    hi = ir.Call("min", (end, ir.add(lo, size)))
    call = ir.Call(
        ROWS_NAME,
        (*(ir.Var(p.name) for p in sig.params), *(ir.Var(x) for x in locals_used), lo, hi),
    )
    schedule = ir.Parallel(par.unit, par.schedule, "", only_if=par.only_if)
    stmts.append(
        ir.For(c, ir.IntLit(0), ir.Var(chunks), ir.block(ir.Effect(call)), parallel=schedule)
    )
    return stmts


def _names(body: ir.Block) -> tuple[set[str], set[str], set[str]]:
    """(names read, names written, names declared) by the statements of ``body``."""
    read: set[str] = set()
    written: set[str] = set()
    inside: set[str] = set()
    for s in statements(body):
        match s:
            case ir.Decl(name=name) | ir.Alloc(name=name):
                inside.add(name)
            case ir.Pointer(name=name, base=base, fallback=fallback):
                inside.add(name)
                read.update(x for x in (base, fallback) if x)
            case ir.For(var=var):
                inside.add(var)
            case ir.Assign(target=ir.Var(name=name)):
                written.add(name)
            case ir.Assign(target=ir.Load(array=array)):
                written.add(array)
            case ir.Effect(call=call):
                written.update(a.name for a in call.args if isinstance(a, ir.Var))
        for e in exprs(s):
            for x in subexpressions(e):
                if isinstance(x, ir.Var):
                    read.add(x.name)
                elif isinstance(x, ir.Load):
                    read.add(x.array)
    return read, written, inside
