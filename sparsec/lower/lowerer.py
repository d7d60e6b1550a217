"""Lowering: concrete index notation + formats → loop IR (TACO's level-function lowering).

For each index variable in loop order the lowerer builds the merge lattice of the
expression and emits one of

* a dense loop over ``0..N`` when the lattice is *full* (some point has no iterator),
  co-iterating any sparse iterators by coordinate match;
* a position loop ``for p in pos[parent]..pos[parent+1]`` for a single iterator;
* for several iterators, one ``while`` loop per lattice point, each running while all
  its iterators have positions left, with one case per sub-point (TACO's co-iteration).

Inside a case, levels that hold the bound variable are *located* when they are dense
(``p_k = p_{k-1} * N + i``), and lowering recurses on the case's simplified expression.
At the innermost level the value is stored into the output (``+=`` into a zeroed dense
output), or into a scalar accumulator when only reduction loops remain. Nested sums
(left under ``+``) are computed into scalar temporaries where they are used.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from ..abi import BOUND_VIOLATED, OUT_OF_MEMORY, Namer, Signature
from ..errors import LoweringError, ScheduleError
from ..frontend.concrete import ZERO, CExpr, Sum, Zero, accesses, divides
from ..frontend.notation import Access, BinOp, Literal, Neg
from ..ir import nodes as ir
from ..middle.lattice import Iterator, Lattice, LatticePoint, build, ordered
from ..middle.order import Edge, edges, level_indices, loop_order, output_edges
from ..middle.schedule import (
    GPU_UNITS,
    Command,
    Parallelize,
    Plan,
    Precompute,
    Space,
    check_order,
    factors,
    make_plan,
)
from ..middle.spec import Spec
from ..tensors.formats import dense
from .assemble import Assembler

#: the most output elements `Temporary` copies in all (threads x output size)
MAX_COPY_ELEMENTS = 1 << 26


class RowsOutOfOrder(LoweringError):
    """A rowwise sparse output's single-pass kernel cannot append its rows in storage
    order: the inputs force its dense levels into another order. Its two phases count
    and fill the rows in any order, so the runtime uses those."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A storage level whose position is known: ``pos`` and the end of its segment."""

    pos: ir.Expr
    next: ir.Expr


@dataclass(frozen=True, slots=True)
class Ctx:
    """What is known at a point of the loop nest (immutable; extended by `bind`)."""

    coords: dict[str, ir.Expr] = field(default_factory=dict)
    levels: dict[tuple[Access, int], Bound] = field(default_factory=dict)
    #: variables bound by plain dense loops, which visit every coordinate exactly once
    covered: frozenset[str] = frozenset()
    #: values of the schedule's derived loop variables (split pieces, pos, fuse)
    loopvars: dict[str, ir.Expr] = field(default_factory=dict)
    #: ranges of the schedule's spaces entered so far
    spaces: dict[str, SpaceState] = field(default_factory=dict)

    def bind(
        self,
        coords: dict[str, ir.Expr] | None = None,
        levels: dict[tuple[Access, int], Bound] | None = None,
        covered: str | None = None,
        loopvars: dict[str, ir.Expr] | None = None,
        spaces: dict[str, SpaceState] | None = None,
    ) -> Ctx:
        return replace(
            self,
            coords={**self.coords, **(coords or {})},
            levels={**self.levels, **(levels or {})},
            covered=self.covered | {covered} if covered else self.covered,
            loopvars={**self.loopvars, **(loopvars or {})},
            spaces={**self.spaces, **(spaces or {})},
        )

    def depth(self, access: Access) -> int:
        """Number of leading levels of ``access`` whose positions are known."""
        k = 0
        while (access, k) in self.levels:
            k += 1
        return k


@dataclass(frozen=True, slots=True)
class SpaceState:
    """A schedule space once entered: its range, and per fused level its position range."""

    lo: ir.Expr
    extent: ir.Expr
    #: (lo, hi) of the positions of each level of a fused position space
    levels: tuple[tuple[ir.Expr, ir.Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class OutputSink:
    pass


@dataclass(frozen=True, slots=True)
class AccSink:
    name: str
    #: set to 1 when a term is added (sparse outputs store only reached entries)
    flag: str = ""


@dataclass(frozen=True, slots=True)
class WorkspaceSink:
    """Scatter into a dense workspace over the output's last level (Gustavson)."""


@dataclass(frozen=True, slots=True)
class DenseWsSink:
    """Add into a precompute workspace ``array[coordinate of var]``."""

    array: str
    var: str


@dataclass(frozen=True, slots=True)
class SegmentSink:
    """Atomic stores from a serial loop, combined while they hit the same output element:
    ``acc`` sums the run, ``at`` holds its element (-1 before the first)."""

    acc: str
    at: str


Sink = OutputSink | AccSink | WorkspaceSink | DenseWsSink | SegmentSink


@dataclass(frozen=True, slots=True)
class LoweredKernel:
    body: ir.Block
    loop_order: tuple[str, ...]
    #: loops that run on CPU threads, by index variable
    parallel_loops: tuple[str, ...] = ()
    #: every output element is written exactly once (no zeroing; ``=`` stores)
    exclusive: bool = False
    #: how each parallel loop runs, in words (header comment and `Kernel.schedule`)
    notes: tuple[str, ...] = ()
    #: what each `bound` promises (the kernel returns BOUND_VIOLATED when one fails)
    bounds: tuple[str, ...] = ()
    #: CUDA: the output must be zeroed before the launch (the kernel only adds into it)
    zero_before: bool = False
    #: CUDA: the grid (trip count of the GPUBlock loop) and the threads per block
    grid: ir.Expr | None = None
    block: int = 1
    #: CUDA: the kernel reduces across a warp's lanes with shuffles
    shuffles: bool = False


class Lowerer:
    """Holds what every step needs: the spec, the ABI names, and the name supply."""

    def __init__(
        self,
        spec: Spec,
        sig: Signature,
        namer: Namer,
        *,
        parallel: bool = True,
        exclusive: bool = False,
        counting: bool = False,
        append: bool = False,
        commands: tuple[Command, ...] = (),
        target: str = "c",
    ) -> None:
        self.spec = spec
        #: "c" (OpenMP loops) or "cuda" (GPU loops; the runtime zeroes the output)
        self.target = target
        self.gpu = target == "cuda"
        #: GPU units of the loops enclosing the point being lowered, outermost first
        self.gpu_units: tuple[str, ...] = ()
        #: the trip count of the GPUBlock loop (the launch's grid), once lowered
        self.grid: ir.Expr | None = None
        #: per-thread accumulators whose lanes a warp adds up (ParallelReduction on a lane
        #: loop in the accumulator's scope) before lane 0 stores the warp's sum
        self.warp_reduced: set[str] = set()
        self.lane0 = False
        #: accumulators that a GPU loop with Atomics shares (its threads, warps or blocks
        #: each hold a part), so each part is added atomically into the output
        self.partial_accs: set[str] = set()
        self.partial = False
        #: the GPU units of the loops in each accumulator's scope ("lane": a GPUThread loop
        #: inside a GPUWarp loop)
        self.acc_units: dict[str, set[str]] = {}
        self.sig = sig
        self.namer = namer
        self.formats = spec.formats
        self.lhs = spec.statement.lhs
        #: the user's schedule (empty: the default) and, once applied, its plan
        self.commands = commands
        self.plan: Plan | None = None
        #: threads may be used at all (``schedule="serial"`` turns them off)
        self.threads_ok = parallel
        #: the default heuristic picks the parallel loop (off when the user parallelizes)
        self.parallel = (
            parallel and not self.gpu and not any(c.name == "parallelize" for c in commands)
        )
        # state while lowering the body of a user-parallel loop
        self.in_threads = False
        self.in_vector = False
        self.atomic_writes = False
        self.out_redirect: str | None = None
        self.in_where = False
        self.where: _Where | None = None
        #: local arrays read like tensors (precompute workspaces): tensor name → C name
        self.local_vals: dict[str, str] = {}
        self.notes: list[str] = []
        self.entry_checks: list[ir.Stmt] = []
        self.bound_messages: list[str] = []
        #: allocations at the start of the kernel and their release at the end
        self.top: list[ir.Stmt] = []
        self.bottom: list[ir.Stmt] = []
        self.var_names = {i: namer.fresh(i) for i in spec.indices}
        #: dense-exact lowering (see `lattice.build`) when the expression may make inf/NaN
        self.exact = divides(spec.statement.rhs)
        #: second pass: output writes are known to be exclusive (see `lower`)
        self.exclusive = exclusive
        self.out_op = "=" if exclusive else "+="
        #: per output write site: does it write each element exactly once?
        self.write_sites: list[bool] = []
        self.parallel_loops: list[str] = []
        #: zero the output slice of each outermost iteration (cache-hot) instead of up front
        self.zero_in_loop = False
        self.zeroed_slices = False
        #: sparse output: the kernel assembles pos/crd/vals (``counting``: sizes only)
        self.assembler = (
            None
            if spec.output.format.is_dense
            else Assembler(self, counting=counting, append=append)
        )
        #: index of the output's last level when it is scattered into a workspace
        self.workspace: str | None = None
        #: sparse output: per nested sum of the statement being stored, the flag its loops
        #: set when they reach a term (see `_presence`)
        self.reached_of: dict[Sum, str] = {}

    # ----------------------------------------------------------------- entry
    def kernel(self) -> LoweredKernel:
        stmt = self.spec.statement
        everything = [self.lhs, *accesses(stmt.rhs)]
        asm = self.assembler
        fmt = self.spec.output.format
        # rows counted and filled independently may be visited in any order of their levels
        in_order = asm is None or not asm.rowwise
        extra = output_edges(self.lhs, fmt, stmt.top_sums, rows_in_order=in_order)
        try:
            order, extra = self._loop_order(everything, extra)
        except LoweringError:
            if asm is None or not asm.layout.rowwise or asm.rowwise:
                raise
            # the single pass appends rows in storage order, which the inputs rule out
            self._loop_order(everything, output_edges(self.lhs, fmt, stmt.top_sums, False))
            raise RowsOutOfOrder(
                f"the inputs visit the rows of {self.lhs.name} ({fmt}) out of storage order"
            ) from None
        if self.commands:
            order = self._apply_schedule(order, everything, extra)
        if self.gpu:
            self._gpu_support()
        # one epilogue for every output: the schedule's entry checks, then a sparse output
        # is opened, filled in loop order and closed by the assembler, a dense one zeroed
        # (unless written exactly once) and filled
        opening = asm.workspace_alloc(self.workspace) if asm is not None else []
        self.zero_in_loop = (
            asm is None
            and not self.gpu
            and not stmt.accumulate
            and not self.exclusive
            and self.lhs.order > 0
            and order[0] == level_indices(self.lhs, self.spec.output.format)[0]
        )
        ctx = self._locate(Ctx(), [self.lhs])
        if asm is not None and self.workspace and asm.layout.last == 0:
            body = self._scatter_gather(order, stmt.rhs, ctx[1])
        else:
            body = self.loops(order, stmt.rhs, ctx[1], OutputSink(), outermost=True)
        closing: list[ir.Stmt] = []
        zeroed = stmt.accumulate or self.exclusive or self.zeroed_slices
        if asm is not None:
            opening = [*asm.prologue(), *opening]
            closing = [*asm.workspace_free(self.workspace), *asm.epilogue()]
        elif not (zeroed or self.gpu):
            opening = [self._zero_output()]
        exclusive = bool(self.write_sites) and all(self.write_sites) and not stmt.accumulate
        return LoweredKernel(
            ir.block(
                *self.entry_checks,
                *opening,
                *self.top,
                ctx[0],
                body,
                *self.bottom,
                *closing,
            ),
            order,
            tuple(self.parallel_loops),
            exclusive,
            tuple(self.notes),
            tuple(self.bound_messages),
            zero_before=self.gpu and not zeroed,
            grid=self.grid,
            block=self._block_size(),
            shuffles=bool(self.warp_reduced),
        )

    def _loop_order(
        self, everything: list[Access], extra: tuple[Edge, ...]
    ) -> tuple[tuple[str, ...], tuple[Edge, ...]]:
        """The loop order and the output's edges it keeps; sets `workspace` when the
        output's last level is scattered into one."""
        stmt = self.spec.statement
        if not self._forced_workspace():
            try:
                return loop_order(stmt.loop_indices, everything, self.formats, extra=extra), extra
            except LoweringError:
                if self.assembler is None or not self.assembler.can_scatter():
                    raise
        # the last output level cannot come before the reductions (or the schedule asks
        # for a workspace): scatter it into a dense workspace and append the row
        # afterwards (Gustavson's SpGEMM)
        assert self.assembler is not None
        ws = self.assembler.vars[self.assembler.layout.last]
        extra = tuple(e for e in extra if ws not in (e.before, e.after))
        order = loop_order(stmt.loop_indices, everything, self.formats, extra=extra)
        self.workspace = ws
        return order, extra

    # ------------------------------------------------------------------ CUDA
    def _gpu_support(self) -> None:
        """What the CUDA target cannot map (yet), refused before any code exists."""
        if self.assembler is not None:
            raise ScheduleError(
                f"the output {self.lhs.name} is sparse ({self.spec.output.format}); sparse "
                "outputs have no GPU mapping yet: use target='c', or a dense output"
            )
        plan = self.plan
        if plan is None or not any(p.unit in GPU_UNITS for p in plan.parallel.values()):
            raise ScheduleError(
                "the CUDA target needs a GPU mapping: parallelize a loop with GPUBlock "
                "(and GPUThread inside it)"
            )
        for space in plan.spaces.values():
            if space.bound is not None:
                raise ScheduleError(f"{space.origin}: bound is supported on the C target only")
        for pre in plan.precompute:
            raise ScheduleError(
                f"{pre.origin}: workspaces (precompute) are supported on the C target only"
            )

    def _block_size(self) -> int:
        """Threads per block: the GPUThread loop's split factor (a warp loop's times 32)."""
        if not self.gpu or self.plan is None:
            return 1
        plan = self.plan
        warps = [v for v, p in plan.parallel.items() if p.unit == "GPUWarp"]
        threads = [v for v, p in plan.parallel.items() if p.unit == "GPUThread"]
        if warps:
            return min(1024, 32 * _factor_of(plan, warps[0], 8))
        if threads:
            return min(1024, max(32, _factor_of(plan, threads[0], 256)))
        return 1

    # -------------------------------------------------------------- schedule
    def _forced_workspace(self) -> bool:
        """A sparse output whose schedule asks for a workspace (precompute, Insert)."""
        if self.assembler is None:
            return False
        for c in self.commands:
            if c.name == "precompute" or (c.name == "assemble" and c.args[1:] == ("Insert",)):
                if not self.assembler.can_scatter():
                    raise ScheduleError(
                        f"{c}: the output {self.lhs.name} ({self.spec.output.format}) cannot be "
                        "filled through a workspace: that needs a unique compressed last level "
                        "with no level below it (e.g. csr)"
                    )
                return True
        return False

    def _apply_schedule(
        self, order: tuple[str, ...], everything: list[Access], extra: tuple[Edge, ...]
    ) -> tuple[str, ...]:
        stmt = self.spec.statement
        nested = tuple(i for i in self.spec.indices if i not in stmt.loop_indices)
        levels: dict[str, list[tuple[str, ...]]] = {}
        for a in dict.fromkeys(accesses(stmt.rhs)):
            levels.setdefault(a.name, []).append(level_indices(a, self.formats[a.name]))
        plan = make_plan(
            self.commands,
            order,
            indices=self.spec.indices,
            nested=nested,
            tensors={t.name: t.order for t in self.spec.tensors},
            output=self.lhs.name,
            tensor_levels=levels,
        )
        hard, _ = edges(everything, self.formats, set(stmt.loop_indices), set())
        hard += [e for e in extra if e.before in stmt.loop_indices and e.after in stmt.loop_indices]
        check_order(plan, hard, {t.name: str(t.format) for t in self.spec.tensors})
        self.plan = plan
        for v in plan.order:
            if v not in self.var_names:
                self.var_names[v] = self.namer.fresh(v)
        for space in plan.spaces.values():
            if space.bound is not None:
                self._bound_check(space)
        if self.assembler is not None:
            self._check_sparse_schedule(plan)
        elif plan.precompute:
            self.where = self._plan_where(plan.precompute[0], tuple(plan.order))
        for command in self.commands:
            if command.name == "assemble":
                if self.assembler is None:
                    raise ScheduleError(
                        f"{command}: the output {self.lhs.name} is dense; assemble applies to "
                        "sparse outputs"
                    )
                if command.args[1] == "Append" and self.workspace is not None:
                    raise ScheduleError(
                        f"{command}: {self.lhs.name}'s last level ({self.workspace}) is reduced "
                        f"over after its loop, so its entries cannot be appended in order; "
                        f"use assemble({self.lhs.name},Insert) (a workspace)"
                    )
        return tuple(plan.order)

    def _check_sparse_schedule(self, plan: Plan) -> None:
        """Sparse outputs are appended in order: only order-keeping commands apply."""
        for space in plan.spaces.values():
            if set(space.vars) & set(self.lhs.indices):
                raise ScheduleError(
                    f"{space.origin}: the output {self.lhs.name} is sparse "
                    f"({self.spec.output.format}) and is appended in loop order; split, "
                    "divide, pos, fuse and bound apply to its reduction loops only (for "
                    "example k in A(i,j) = B(i,j) * C(i,k) * D(k,j))"
                )
        for pre in plan.precompute:
            want = sorted(map(str, factors(self.spec.statement.rhs)))
            got = sorted(map(str, factors(pre.expr)))
            if got != want or pre.var != self.workspace:
                raise ScheduleError(
                    f"{pre.origin}: for the sparse output {self.lhs.name}, precompute takes the "
                    f"whole right-hand side over its last level: precompute("
                    f"{self.spec.statement.rhs},{self.workspace},{pre.workspace})"
                )

    def _bound_check(self, space: Space) -> None:
        """`bound` promises an extent: the kernel returns a status when it does not hold."""
        assert space.bound is not None
        size, kind = space.bound
        (var,) = space.vars
        dim = ir.Var(self.sig.dim(var))
        bad = ir.Bin("!=" if kind == "MaxExact" else ">", dim, ir.IntLit(size))
        self.entry_checks.append(ir.Return(BOUND_VIOLATED, bad))
        self.bound_messages.append(
            f"{space.origin}: the extent of {var} must be "
            f"{'exactly' if kind == 'MaxExact' else 'at most'} {size}"
        )

    def _write(self, ctx: Ctx, value: ir.Expr | None) -> ir.Block:
        """Store into the output; records whether this site writes each element once."""
        if self.assembler is not None:
            return ir.block(*self.assembler.store(self._output_slot(ctx), value))
        assert value is not None
        lhs = set(self.lhs.indices)
        if self.partial:
            # every thread adds its own partial sum: several writes, each atomic
            self.write_sites.append(False)
            slot = self._output_slot(ctx)
            return ir.block(ir.Assign(slot, value, "+=", atomic=True))
        if not self.lane0:
            self._one_store_per_part()
        # a schedule space entered around the write repeats it unless it is a plain range
        # over output indices (a split of i: every i once)
        spaces = self.plan.spaces if self.plan is not None else {}
        in_spaces = all(set(spaces[n].vars) <= lhs & ctx.covered for n in ctx.spaces)
        self.write_sites.append(lhs <= ctx.covered and set(ctx.coords) <= lhs and in_spaces)
        return ir.block(
            ir.Assign(self._output_slot(ctx), value, self.out_op, atomic=self.atomic_writes)
        )

    def _one_store_per_part(self, shared: set[str] | None = None, reduced: bool = False) -> None:
        """On the GPU each part of the result is stored by one thread: threads that no GPU
        loop tells apart (the loops around the store, and ``shared``: those in the scope of
        the accumulator it stores; "lane": a GPUThread loop in a warp) hold the same value,
        and each would store it. ``reduced``: lane 0 alone stores a warp's sum."""
        if not self.gpu or self._block_size() <= 1:
            return
        units = set(self.gpu_units) | (shared or set())
        lanes_apart = reduced or bool({"GPUThread", "lane"} & units)
        warps_apart = bool({"GPUThread", "GPUWarp", "lane"} & units)
        if lanes_apart and warps_apart:
            return
        who = "every lane of a warp" if warps_apart else "every thread of a block"
        raise ScheduleError(
            f"the store into {self.lhs.name} runs outside the GPUThread loops, so {who} "
            "would do it; map the loops that bind "
            f"{', '.join(self.lhs.indices) or 'the output'} to GPUThread, or a loop of the "
            "sum inside the GPUWarp/GPUBlock loop to GPUThread with Atomics, or reduce with "
            "ParallelReduction on a GPUThread loop inside a GPUWarp loop"
        )

    def _write_with(self, flag: str, ctx: Ctx, value: ir.Expr) -> ir.Block:
        """`_write` with the boolean attribute ``flag`` (``lane0``, ``partial``) set."""
        setattr(self, flag, True)
        try:
            return self._write(ctx, value)
        finally:
            setattr(self, flag, False)

    def _zero_output(self) -> ir.Stmt:
        out = self.spec.output
        size: ir.Expr = ir.IntLit(1)
        for var in level_indices(self.lhs, out.format):
            size = ir.mul(size, ir.Var(self.sig.dim(var)))
        vals = self.sig.array(out.name, "vals")
        p = self.namer.fresh("p")
        store = ir.Assign(ir.Load(vals, ir.Var(p)), ir.FloatLit(0.0))
        par = ir.Parallel("CPUThread", "static") if self.threads_ok and self.lhs.order else None
        return ir.block(
            ir.Comment(f"zero the output {out.name}"),
            ir.For(p, ir.IntLit(0), size, ir.block(store), par),
        )

    def _zero_slice(self, coord: ir.Expr) -> ir.Stmt:
        """Zero the output elements whose first-level coordinate is ``coord``."""
        self.zeroed_slices = True
        size: ir.Expr = ir.IntLit(1)
        for var in level_indices(self.lhs, self.spec.output.format)[1:]:
            size = ir.mul(size, ir.Var(self.sig.dim(var)))
        vals = self.sig.array(self.spec.output.name, "vals")
        p = self.namer.fresh("p")
        start = ir.mul(coord, size)
        store = ir.Assign(ir.Load(vals, ir.add(start, ir.Var(p))), ir.FloatLit(0.0))
        return ir.For(p, ir.IntLit(0), size, ir.block(store))

    def _parallel_for(self, var: str, trip: ir.Expr) -> tuple[ir.Stmt, ir.Parallel]:
        """A dynamic schedule with about eight chunks per thread (skewed rows balance)."""
        self.parallel_loops.append(var)
        chunk = self.namer.fresh("chunk")
        threads = ir.Var(self.sig.threads)
        per = ir.Bin("*", ir.IntLit(8), threads)
        size = ir.Bin("/", ir.Bin("+", trip, ir.Bin("-", per, ir.IntLit(1))), per)
        decl = ir.Decl(ir.I64, chunk, ir.Call("max", (ir.IntLit(1), size)))
        return decl, ir.Parallel("CPUThread", "dynamic", chunk)

    # ------------------------------------------------------------ precompute
    def _binds(self, order: tuple[str, ...]) -> set[str]:
        """Original index variables bound by the loops ``order``."""
        if self.plan is None:
            return set(order)
        return {v for loop in order for v in self.plan.binds(loop)}

    def _plan_where(self, pre: Precompute, order: tuple[str, ...]) -> _Where:
        """Where a dense precompute goes: before the first loop that only the workspace
        expression uses (or the workspace's own variable); the loops inside it split into
        the producer's and the consumer's."""
        plan = self.plan
        assert plan is not None
        rhs = self.spec.statement.rhs
        have = factors(rhs)
        if not have:
            raise ScheduleError(
                f"{pre.origin}: the right-hand side {rhs} is not a product; precompute takes "
                "some of its factors"
            )
        produce: list[Access | Literal] = []
        for f in factors(pre.expr):
            match = next((g for g in have if g == f), None)
            if match is None:
                raise ScheduleError(
                    f"{pre.origin}: {f} is not a factor of the right-hand side {rhs}"
                )
            have.remove(match)
            produce.append(match)
        evars = {i for f in produce if isinstance(f, Access) for i in f.indices}
        rvars = {i for f in have if isinstance(f, Access) for i in f.indices}
        rvars |= set(self.lhs.indices)
        if pre.var not in evars:
            raise ScheduleError(f"{pre.origin}: {pre.var} is not an index of {pre.expr}")
        own = (evars - rvars) | {pre.var}
        at = next(n for n, loop in enumerate(order) if set(plan.binds(loop)) & own)
        producer: list[str] = []
        consumer: list[str] = []
        for loop in order[at:]:
            if plan.space_of(loop) is not None:
                raise ScheduleError(
                    f"{pre.origin}: the loop {loop} ({_origin_of(plan, loop)}) runs inside the "
                    "workspace; the loops inside a precompute cannot be split, pos-iterated "
                    "or fused"
                )
            if loop == pre.var:
                producer.append(loop)
                consumer.append(loop)
            elif loop in evars - rvars:
                producer.append(loop)
            elif loop in evars:
                raise ScheduleError(
                    f"{pre.origin}: {loop} indexes both {pre.expr} and the rest of the "
                    f"expression but runs inside the workspace over {pre.var}; reorder so "
                    f"that {loop} encloses the loops of {', '.join(sorted(own))}"
                )
            else:
                consumer.append(loop)
        name = f"{pre.workspace}_ws"
        while name in self.formats:
            name += "_"
        self.formats[name] = dense(1)
        base = self.namer.fresh(f"{pre.workspace}_all")
        dim = ir.Var(self.sig.dim(pre.var))
        self.top += [
            ir.Comment(f"{pre.origin}: a dense workspace over {pre.var} per thread"),
            ir.Alloc(ir.VAL, base, ir.mul(ir.Var(self.sig.threads), dim)),
            ir.Return(OUT_OF_MEMORY, ir.Unary("!", ir.Var(base))),
        ]
        self.bottom.append(ir.Free(base))
        return _Where(
            order[at],
            pre.var,
            tuple(producer),
            tuple(consumer),
            tuple(produce),
            Access(name, (pre.var,)),
            base,
            pre.origin,
        )

    def _emit_where(self, order: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: Sink) -> ir.Block:
        where = self.where
        assert where is not None
        have = factors(expr)
        rest = list(have)
        for f in where.produce:
            if f not in rest:
                raise LoweringError(f"internal: {f} missing from {expr} at the precompute")
            rest.remove(f)
        dim = ir.Var(self.sig.dim(where.var))
        ws = self.namer.fresh(where.workspace.name)
        q = self.namer.fresh("q")
        stmts: list[ir.Stmt] = [
            ir.Comment(f"{where.origin}"),
            ir.Pointer(ir.VAL, ws, where.base, ir.mul(ir.Call("thread_id", ()), dim)),
            ir.For(
                q, ir.IntLit(0), dim, ir.block(ir.Assign(ir.Load(ws, ir.Var(q)), ir.FloatLit(0.0)))
            ),
        ]
        self.local_vals[where.workspace.name] = ws
        self.in_where = True
        try:
            stmts.append(
                self.loops(
                    where.producer_order, _product(where.produce), ctx, DenseWsSink(ws, where.var)
                )
            )
            stmts.append(
                self.loops(where.consumer_order, _product([where.workspace, *rest]), ctx, sink)
            )
        finally:
            self.in_where = False
        return ir.block(*stmts)

    # ------------------------------------------------- user parallel loops
    def _loop_setup(
        self,
        loop: str,
        distinct: frozenset[str],
        ctx: Ctx,
        sink: Sink,
        kind: str,
        trip: ir.Expr,
        outermost: bool,
    ) -> _LoopSetup:
        """How the loop over ``loop`` runs: the user's `parallelize` (race analysis and
        strategy) or the default, and `unroll`.

        ``distinct``: original variables in which any two iterations are sure to differ;
        ``kind``: "for", or a description of why the loop is a while loop.
        """
        setup = _LoopSetup()
        plan = self.plan
        if plan is not None and loop in plan.unroll:
            if kind != "for":
                raise ScheduleError(
                    f"unroll({loop},{plan.unroll[loop]}): the loop over {loop} is a while "
                    f"loop ({kind}); unroll applies to for loops"
                )
            setup.unroll = plan.unroll[loop]
        req = plan.parallel.get(loop) if plan is not None else None
        if req is not None and setup.unroll:
            raise ScheduleError(
                f"unroll({loop},{setup.unroll}): the loop over {loop} is also parallelized "
                f"({req.origin}); unroll a loop inside it"
            )
        if req is None:
            # a loop the user unrolls stays serial (an OpenMP pragma must be the last before
            # its loop, as must GCC's unroll)
            if (
                kind == "for"
                and not setup.unroll
                and self._default_parallel(loop, distinct, outermost)
            ):
                decl, par = self._parallel_for(loop, trip)
                setup.pre.append(decl)
                setup.parallel = par
                setup.flags["in_threads"] = True
            elif (
                kind == "for"
                and not setup.unroll
                and self.parallel
                and outermost
                and self.assembler is None
                and isinstance(sink, (OutputSink, AccSink))
            ):
                # the iterations share output elements: each thread reduces on its own
                setup.flags["in_threads"] = True
                out = self.lhs.name
                if isinstance(sink, AccSink):
                    decl, par = self._parallel_for(loop, trip)
                    setup.pre.append(decl)
                    setup.parallel = replace(par, reduction=(sink.name,))
                    self.notes.append(f"{loop}: CPUThread, reduction(+) into {out}")
                else:
                    self._private_copies(loop, trip, setup)
                    self.notes.append(
                        f"{loop}: CPUThread, each thread adds into its own copy of {out}, "
                        "summed after"
                    )
            return setup
        cmd = req.origin
        if not self.threads_ok:
            return setup
        if self.gpu:
            return self._gpu_setup(loop, req, distinct, sink, kind, trip, setup)
        if req.unit in GPU_UNITS:
            raise ScheduleError(
                f"{cmd}: {req.unit} is a CUDA unit; the C target runs CPUThread and CPUVector loops"
            )
        if kind != "for":
            raise ScheduleError(
                f"{cmd}: the loop over {loop} is a while loop ({kind}); its iterations depend "
                "on each other. Parallelize an enclosing loop, or iterate one operand's "
                f"positions with pos({loop},...)"
            )
        if self.in_vector or (self.in_threads and req.unit == "CPUThread"):
            raise ScheduleError(
                f"{cmd}: it is nested inside another parallel loop; only one CPUThread loop, "
                "with CPUVector loops inside it, is supported"
            )
        if self.in_where or isinstance(sink, (WorkspaceSink, DenseWsSink)):
            raise ScheduleError(
                f"{cmd}: the loop runs inside a workspace (precompute) that all its iterations "
                "share; parallelize a loop outside the workspace"
            )
        out = self.lhs.name
        lhs = set(self.lhs.indices)
        if self.assembler is not None and not isinstance(sink, AccSink):
            if not (
                req.unit == "CPUThread" and self.assembler.rowwise and outermost and loop in lhs
            ):
                raise ScheduleError(
                    f"{cmd}: the sparse output {out} ({self.spec.output.format}) is appended "
                    "in one sequence; only its outermost row loop can run on CPU threads, and "
                    "only when a dense level holds the rows (e.g. csr)"
                )
            decl, par = self._parallel_for(loop, trip)
            setup.pre.append(decl)
            setup.parallel = par
            setup.flags["in_threads"] = True
            self.notes.append(f"{loop}: CPUThread, rows of {out} assembled independently")
            return setup
        target_acc = isinstance(sink, AccSink)
        why = self._race(loop, distinct, sink)
        unit_flag = "in_threads" if req.unit == "CPUThread" else "in_vector"
        setup.flags[unit_flag] = True
        if why is None:
            if req.unit == "CPUThread":
                decl, par = self._parallel_for(loop, trip)
                setup.pre.append(decl)
                setup.parallel = par
            else:
                setup.parallel = ir.Parallel("CPUVector")
            self.notes.append(
                f"{loop}: {req.unit}, race-free (each iteration writes its own {out} elements)"
            )
            return setup
        usable = self._race_strategies(req.unit, target_acc)
        advice = (
            f"Use {' or '.join(usable)}"
            if usable
            else f"Parallelize a loop whose iterations write distinct elements of {out}"
        )
        match req.races:
            case "NoRaces" | "IgnoreRaces":
                raise ScheduleError(
                    f"{cmd}: iterations of {loop} write the same element of {out} ({why}); "
                    f"with {req.races} that would give a wrong sum. {advice}"
                )
            case "Atomics" if req.unit == "CPUThread" and self.assembler is None:
                assert isinstance(sink, (AccSink, OutputSink))
                setup.flags["atomic_writes"] = True
                decl, par = self._parallel_for(loop, trip)
                setup.pre.append(decl)
                setup.parallel = par
                target = sink.name if isinstance(sink, AccSink) else f"{out}"
                self.notes.append(f"{loop}: CPUThread, atomic updates of {target}")
            case "Temporary" | "ParallelReduction" if target_acc:
                assert isinstance(sink, AccSink)
                sums = (sink.name,) if sink.name else ()
                flags = (sink.flag,) if sink.flag else ()
                if req.unit == "CPUThread":
                    decl, par = self._parallel_for(loop, trip)
                    setup.pre.append(decl)
                    setup.parallel = replace(par, reduction=sums, flags=flags)
                else:
                    setup.parallel = ir.Parallel("CPUVector", reduction=sums, flags=flags)
                self.notes.append(f"{loop}: {req.unit}, reduction(+) into a private accumulator")
            case "Temporary" if req.unit == "CPUThread":
                self._private_copies(loop, trip, setup)
                self.notes.append(
                    f"{loop}: CPUThread, each thread adds into its own copy of {out}, summed after"
                )
            case _:
                raise ScheduleError(
                    f"{cmd}: {req.races} does not apply here: {self._why_not(req.races, req.unit)}"
                    f"; the iterations of {loop} race ({why}). {advice}"
                )
        return setup

    def _race_strategies(self, unit: str, into_sum: bool) -> list[str]:
        """The race strategies `_loop_setup` carries out for a racy CPU loop of ``unit``
        (``into_sum``: its iterations add into a scalar accumulator, not the output)."""
        table = (
            ("Atomics", unit == "CPUThread" and self.assembler is None),
            ("Temporary", into_sum or unit == "CPUThread"),
            ("ParallelReduction", into_sum),
        )
        return [name for name, applies in table if applies]

    def _why_not(self, races: str, unit: str) -> str:
        """Why strategy ``races`` cannot serve a racy CPU loop of ``unit`` (see
        `_race_strategies`)."""
        out = self.lhs.name
        if races == "Atomics" and unit != "CPUThread":
            return f"{unit} loops make no atomic updates"
        if races == "Atomics":
            return f"the sparse output {out} is appended entry by entry, never updated in place"
        return f"the loop adds straight into {out}, not into a sum of its own"

    def _gpu_setup(
        self,
        loop: str,
        req: Parallelize,
        distinct: frozenset[str],
        sink: Sink,
        kind: str,
        trip: ir.Expr,
        setup: _LoopSetup,
    ) -> _LoopSetup:
        """A loop mapped to the GPU: nesting rules, then the same race analysis as on the
        CPU (a thread's locals are private, so a shared accumulator is a warp reduction)."""
        cmd = req.origin
        unit = req.unit
        if unit not in GPU_UNITS:
            raise ScheduleError(
                f"{cmd}: {unit} is a CPU unit; the CUDA target maps loops to GPUBlock, "
                "GPUWarp and GPUThread"
            )
        if kind != "for":
            raise ScheduleError(
                f"{cmd}: the loop over {loop} is a while loop ({kind}); its iterations depend "
                "on each other. Map an enclosing loop, or iterate one operand's positions "
                f"with pos({loop},...)"
            )
        units = self.gpu_units
        if unit == "GPUBlock" and units:
            raise ScheduleError(
                f"{cmd}: a GPUBlock loop inside a {units[-1]} loop; the grid has one level, "
                "so GPUBlock goes on the outermost GPU loop"
            )
        if unit == "GPUWarp" and units != ("GPUBlock",):
            raise ScheduleError(
                f"{cmd}: GPUWarp needs an enclosing GPUBlock loop, with no other GPU loop "
                "between them"
            )
        if unit == "GPUThread" and "GPUBlock" not in units:
            raise ScheduleError(
                f"{cmd}: GPUThread without an enclosing GPUBlock loop; parallelize an outer "
                "loop with GPUBlock (e.g. split(i,i0,i1,256), parallelize(i0,GPUBlock,"
                "NoRaces), parallelize(i1,GPUThread,NoRaces))"
            )
        if unit == "GPUThread" and "GPUThread" in units:
            raise ScheduleError(f"{cmd}: a GPUThread loop inside another GPUThread loop")
        if unit == "GPUBlock":
            if self.grid is not None:
                raise ScheduleError(
                    f"{cmd}: the GPUBlock loop is reached on more than one path of the loop "
                    "nest; map a loop that runs once per kernel"
                )
            self.grid = trip
        lane = unit == "GPUThread" and "GPUWarp" in units
        setup.flags["gpu_units"] = (*units, unit)
        out = self.lhs.name
        target_acc = isinstance(sink, AccSink)
        why = self._race(loop, distinct, sink)
        par = ir.Parallel(unit, "lane" if lane else "")
        if isinstance(sink, AccSink):
            self.acc_units.setdefault(sink.name, set()).add("lane" if lane else unit)
        if why is None:
            setup.parallel = par
            self.notes.append(f"{loop}: {unit}, race-free")
            return setup
        match req.races:
            case "NoRaces" | "IgnoreRaces":
                raise ScheduleError(
                    f"{cmd}: iterations of {loop} write the same element of {out} ({why}); "
                    f"with {req.races} that would give a wrong sum. Use Atomics"
                    + (" or ParallelReduction" if lane and target_acc else "")
                )
            case "Atomics" if not target_acc:
                setup.flags["atomic_writes"] = True
                setup.parallel = par
                self.notes.append(f"{loop}: {unit}, atomicAdd into {out}")
            case "Atomics":
                # each thread sums its iterations privately, then adds its part atomically
                assert isinstance(sink, AccSink)
                self.partial_accs.add(sink.name)
                setup.parallel = par
                self.notes.append(f"{loop}: {unit}, per-thread partial sums, atomicAdd into {out}")
            case "ParallelReduction" if target_acc and lane:
                assert isinstance(sink, AccSink)
                self.warp_reduced.add(sink.name)
                setup.parallel = par
                self.notes.append(f"{loop}: {unit} lanes, warp shuffle reduction, lane 0 stores")
            case _:
                raise ScheduleError(
                    f"{cmd}: {req.races} does not apply here ({why}); on the GPU use Atomics "
                    "for an output element that threads share, or ParallelReduction on a "
                    "GPUThread loop inside a GPUWarp loop that reduces into one element"
                )
        return setup

    def _race(self, loop: str, distinct: frozenset[str], sink: Sink) -> str | None:
        """Why two iterations of ``loop`` can write one output element, or None if they
        cannot: its iterations differ in ``distinct``, and writes go to ``sink``."""
        out = self.lhs.name
        if isinstance(sink, AccSink):
            return (
                f"every index of {out} is bound outside {loop}, so all its iterations add "
                "into one element"
            )
        if distinct and distinct <= set(self.lhs.indices):
            return None
        return (
            f"{out} is indexed by {', '.join(self.lhs.indices) or 'nothing'}, and two "
            f"iterations of {loop} can share those coordinates"
        )

    def _default_parallel(self, loop: str, distinct: frozenset[str], outermost: bool) -> bool:
        """The default: the outermost loop, when its iterations write disjoint outputs."""
        if not (self.parallel and outermost):
            return False
        if self.assembler is not None and not self.assembler.rowwise:
            return False  # appending into one sequence of positions is serial
        if self.plan is not None and self.plan.space_of(loop) is not None:
            return bool(distinct) and distinct <= set(self.lhs.indices)
        return loop in self.lhs.indices

    def _private_copies(self, loop: str, trip: ir.Expr, setup: _LoopSetup) -> None:
        """`Temporary`: each thread adds into a zeroed copy of the output, summed after.

        The copies exist only with several threads and at most `MAX_COPY_ELEMENTS` in all;
        otherwise (or when calloc fails) the loop runs on one thread into the output.
        """
        out = self.spec.output
        size: ir.Expr = ir.IntLit(1)
        for var in level_indices(self.lhs, out.format):
            size = ir.mul(size, ir.Var(self.sig.dim(var)))
        threads = ir.Var(self.sig.threads)
        base = self.namer.fresh(f"{out.name}_copies")
        mine = self.namer.fresh(f"{out.name}_mine")
        vals = self.sig.array(out.name, "vals")
        total = ir.mul(threads, size)
        worth = ir.conj(
            ir.Bin(">", threads, ir.IntLit(1)),
            ir.Bin("<=", total, ir.IntLit(MAX_COPY_ELEMENTS)),
        )
        decl, par = self._parallel_for(loop, trip)
        setup.pre += [ir.Alloc(ir.VAL, base, total, worth), decl]
        setup.parallel = replace(par, only_if=base)
        setup.body_pre.append(
            ir.Pointer(ir.VAL, mine, base, ir.mul(ir.Call("thread_id", ()), size), vals)
        )
        setup.flags["out_redirect"] = mine
        q, t = self.namer.fresh("q"), self.namer.fresh("t")
        add = ir.Assign(
            ir.Load(vals, ir.Var(q)),
            ir.Load(base, ir.add(ir.mul(ir.Var(t), size), ir.Var(q))),
            "+=",
        )
        combine = ir.For(
            q,
            ir.IntLit(0),
            size,
            ir.block(ir.For(t, ir.IntLit(0), threads, ir.block(add))),
            ir.Parallel("CPUThread", "static"),
        )
        setup.post += [
            ir.Comment(f"sum the threads' copies of {out.name}"),
            ir.If(((ir.Var(base), ir.block(combine, ir.Free(base))),)),
        ]

    def _inside(self, setup: _LoopSetup, build: Callable[[], ir.Block]) -> ir.Block:
        """Lower a loop body with the setup's state flags in force."""
        saved = {k: getattr(self, k) for k in setup.flags}
        for k, v in setup.flags.items():
            setattr(self, k, v)
        try:
            return ir.block(*setup.body_pre, build())
        finally:
            for k, v in saved.items():
                setattr(self, k, v)

    # ------------------------------------------------------- schedule spaces
    def _space_loop(
        self,
        loop: str,
        rest: tuple[str, ...],
        expr: CExpr,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        """One loop of a schedule space: a split piece, or the space's own loop."""
        plan = self.plan
        assert plan is not None
        sname = plan.space_of(loop)
        assert sname is not None
        space = plan.spaces[sname]
        pre: list[ir.Stmt] = []
        if sname not in ctx.spaces:
            stmts, state = self._enter_space(space, ctx)
            pre += stmts
            ctx = ctx.bind(spaces={sname: state})
        extent = self._extent(loop, ctx)
        name = self.var_names[loop]
        completes = plan.leaves(sname)[-1] == loop
        setup = self._loop_setup(loop, self._distinct(space), ctx, sink, "for", extent, outermost)
        inner = ctx.bind(loopvars={loop: ir.Var(name)})

        # a serial loop over fused positions advances its parents' positions as cursors; a
        # parallel one searches them per iteration
        cursors: dict[int, str] | None = None
        if completes and space.kind == "fusedpos" and setup.parallel is None:
            first = self._offset(sname, ctx.bind(loopvars={loop: ir.IntLit(0)}))
            init, cursors = self._cursors_init(space, ctx.spaces[sname], first)
            pre += init

        # atomic stores from this serial loop, one output element per iteration: add up runs
        # that hit the same element (consecutive positions of one row) and store each run once
        flush: list[ir.Stmt] = []
        target = sink
        if (
            completes
            and not rest
            and setup.parallel is None
            and self.atomic_writes
            and self.assembler is None
            and isinstance(sink, OutputSink)
        ):
            acc, at = self.namer.fresh("run"), self.namer.fresh("run_at")
            pre += [ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)), ir.Decl(ir.I64, at, ir.IntLit(-1))]
            target = SegmentSink(acc, at)
            flush.append(self._flush_run(target))

        def body() -> ir.Block:
            if not completes:
                return self.loops(rest, expr, inner, target)
            x = self._offset(sname, inner)
            return self._bind_space(space, x, inner, rest, expr, target, cursors)

        loop_body = self._inside(setup, body)
        for_loop = ir.For(name, ir.IntLit(0), extent, loop_body, setup.parallel, setup.unroll)
        return ir.block(*pre, *setup.pre, for_loop, *flush, *setup.post)

    def _flush_run(self, run: SegmentSink) -> ir.Stmt:
        """Store a run's sum into its element, atomically (if a run has started)."""
        vals = self.out_redirect or self.sig.array(self.lhs.name, "vals")
        store = ir.Assign(ir.Load(vals, ir.Var(run.at)), ir.Var(run.acc), "+=", atomic=True)
        return ir.If(((ir.Bin(">=", ir.Var(run.at), ir.IntLit(0)), ir.block(store)),))

    def _distinct(self, space: Space) -> frozenset[str]:
        """Variables in which two iterations of a space's loops always differ."""
        if space.kind in ("pos", "fusedpos"):
            access = self._pos_access(space)
            fmt = self.formats[access.name]
            first = level_indices(access, fmt).index(space.vars[0])
            unique = all(fmt.levels[first + n].unique for n in range(len(space.vars)))
            return frozenset(space.vars) if unique else frozenset()
        return frozenset(space.vars)

    def _pos_access(self, space: Space) -> Access:
        found = [
            a for a in dict.fromkeys(accesses(self.spec.statement.rhs)) if a.name == space.tensor
        ]
        assert len(found) == 1, found
        return found[0]

    def _extent(self, node: str, ctx: Ctx) -> ir.Expr:
        """The trip count of ``node``'s loop (a space or a split piece)."""
        plan = self.plan
        assert plan is not None
        if node in plan.spaces:
            return ctx.spaces[node].extent
        piece = plan.pieces[node]
        whole = self._extent(piece.parent, ctx)
        f = ir.IntLit(piece.factor)
        chunk = ir.Bin("/", ir.Bin("+", whole, ir.IntLit(piece.factor - 1)), f)
        if piece.outer:
            return f if piece.divide else chunk
        step = chunk if piece.divide else f
        before = ir.mul(self._offset(piece.sibling, ctx), step)
        return ir.Call("min", (step, ir.Bin("-", whole, before)))

    def _offset(self, node: str, ctx: Ctx) -> ir.Expr:
        """``node``'s offset in its space from the bound loop variables."""
        plan = self.plan
        assert plan is not None
        kids = plan.children.get(node)
        if kids is None:
            return ctx.loopvars[node]
        outer, inner = kids
        piece = plan.pieces[outer]
        if piece.divide:
            whole = self._extent(node, ctx)
            step: ir.Expr = ir.Bin(
                "/", ir.Bin("+", whole, ir.IntLit(piece.factor - 1)), ir.IntLit(piece.factor)
            )
        else:
            step = ir.IntLit(piece.factor)
        return ir.add(ir.mul(self._offset(outer, ctx), step), self._offset(inner, ctx))

    def _enter_space(self, space: Space, ctx: Ctx) -> tuple[list[ir.Stmt], SpaceState]:
        """Declare the range of ``space`` where its first loop starts."""
        stmts: list[ir.Stmt] = []
        if space.kind == "dense":
            (var,) = space.vars
            if space.bound is not None and space.bound[1] == "MaxExact":
                return [], SpaceState(ir.IntLit(0), ir.IntLit(space.bound[0]))
            return [], SpaceState(ir.IntLit(0), ir.Var(self.sig.dim(var)))
        if space.kind == "fused":
            size: ir.Expr = ir.IntLit(1)
            for var in space.vars:
                size = ir.mul(size, ir.Var(self.sig.dim(var)))
            return [], SpaceState(ir.IntLit(0), size)
        access = self._pos_access(space)
        fmt = self.formats[access.name]
        levels = level_indices(access, fmt)
        first = levels.index(space.vars[0])
        if ctx.depth(access) != first:
            above = ", ".join(levels[:first])
            raise ScheduleError(
                f"{space.origin}: {access}'s levels above {space.vars[0]} ({above}) must be "
                f"bound before the loops of {space.name} start; reorder so that they enclose it"
            )
        ranges: list[tuple[ir.Expr, ir.Expr]] = []
        for n, var in enumerate(space.vars):
            k = first + n
            level = fmt.levels[k]
            if n == 0:
                parent = ctx.levels.get((access, k - 1)) if k > 0 else None
                if not level.position_iteration:  # a dense level: p = parent * N + coord
                    dim = ir.Var(self.sig.dim(var))
                    lo = ir.mul(parent.pos, dim) if parent else ir.IntLit(0)
                    hi = ir.add(lo, dim)
                elif level.inherits_parent_range:
                    assert parent is not None
                    lo, hi = parent.pos, parent.next
                else:
                    ppos = parent.pos if parent else ir.IntLit(0)
                    arr = self.sig.array(access.name, "pos", k)
                    lo, hi = ir.Load(arr, ppos), ir.Load(arr, ir.add(ppos, ir.IntLit(1)))
            else:
                plo, phi = ranges[-1]
                if level.inherits_parent_range:
                    lo, hi = plo, phi
                elif level.position_iteration:
                    arr = self.sig.array(access.name, "pos", k)
                    lo, hi = ir.Load(arr, plo), ir.Load(arr, phi)
                else:
                    dim = ir.Var(self.sig.dim(var))
                    lo, hi = ir.mul(plo, dim), ir.mul(phi, dim)
            lo_name = self.namer.fresh(f"p{access.name}{k + 1}_lo")
            hi_name = self.namer.fresh(f"p{access.name}{k + 1}_hi")
            stmts += [ir.Decl(ir.I64, lo_name, lo), ir.Decl(ir.I64, hi_name, hi)]
            ranges.append((ir.Var(lo_name), ir.Var(hi_name)))
        lo, hi = ranges[-1]
        return stmts, SpaceState(lo, ir.Bin("-", hi, lo), tuple(ranges))

    def _cursors_init(
        self, space: Space, state: SpaceState, first: ir.Expr
    ) -> tuple[list[ir.Stmt], dict[int, str]]:
        """Before a serial loop over fused positions: each compressed parent level's
        position at the loop's first child position (advanced in the loop). Walks up the
        levels as `_bind_space` does: a singleton child shares its parent's position, a
        dense child divides by its extent, a compressed child is searched."""
        access = self._pos_access(space)
        fmt = self.formats[access.name]
        top = level_indices(access, fmt).index(space.vars[0])
        last = top + len(space.vars) - 1
        searched = {k: (n, arr) for n, k, arr in self._parent_searches(space, access)}
        cursors: dict[int, str] = {}
        stmts: list[ir.Stmt] = []
        target: ir.Expr = ir.add(state.lo, first)
        for k in range(last - 1, top - 1, -1):
            child = fmt.levels[k + 1]
            if child.inherits_parent_range:
                continue
            if not child.position_iteration:
                target = ir.Bin("/", target, ir.Var(self.sig.dim(space.vars[k + 1 - top])))
                continue
            n, arr = searched[k + 1]
            lo, hi = state.levels[n]
            cur = self.namer.fresh(f"p{access.name}{k + 1}_at")
            stmts.append(ir.Decl(ir.I64, cur, ir.Call("search", (ir.Var(arr), lo, hi, target))))
            cursors[k + 1] = cur
            target = ir.Var(cur)
        return stmts, cursors

    def _parent_searches(self, space: Space, access: Access) -> list[tuple[int, int, str]]:
        """(index in space, 1-based level number, child pos array) for each fused level whose
        child level is compressed: its position is found by searching the child's pos."""
        fmt = self.formats[access.name]
        first = level_indices(access, fmt).index(space.vars[0])
        found = []
        for n in range(len(space.vars) - 1):
            k = first + n
            child = fmt.levels[k + 1]
            if child.position_iteration and not child.inherits_parent_range:
                found.append((n, k + 1, self.sig.array(access.name, "pos", k + 1)))
        return found

    def _bind_space(
        self,
        space: Space,
        x: ir.Expr,
        ctx: Ctx,
        rest: tuple[str, ...],
        expr: CExpr,
        sink: Sink,
        cursors: dict[int, str] | None,
    ) -> ir.Block:
        """The space's offset ``x`` is known: bind its original variables and go on.

        ``cursors``: for a serial loop over fused positions, the variables that follow each
        searched parent level (else each parent is searched afresh)."""
        stmts: list[ir.Stmt] = []
        if space.kind in ("dense", "fused"):
            remaining = x
            values: list[tuple[str, ir.Expr]] = []
            for var in reversed(space.vars[1:]):
                dim = ir.Var(self.sig.dim(var))
                values.append((var, ir.Bin("%", remaining, dim)))
                remaining = ir.Bin("/", remaining, dim)
            values.append((space.vars[0], remaining))
            for var, value in reversed(values):
                expr = self._scheduled_expr(space, var, expr, ctx)
                name = self.var_names[var]
                stmts.append(ir.Decl(ir.I64, name, value))
                ctx = ctx.bind({var: ir.Var(name)}, covered=var)
                located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
                stmts.append(located)
        else:
            access = self._pos_access(space)
            fmt = self.formats[access.name]
            first = level_indices(access, fmt).index(space.vars[0])
            state = ctx.spaces[space.name]
            positions: dict[int, ir.Expr] = {}
            last = first + len(space.vars) - 1
            p_last = self.namer.fresh(f"p{access.name}{last + 1}")
            stmts.append(ir.Decl(ir.I64, p_last, ir.add(state.lo, x)))
            positions[last] = ir.Var(p_last)
            searched = {k: (n, arr) for n, k, arr in self._parent_searches(space, access)}
            for k in range(last - 1, first - 1, -1):
                child = fmt.levels[k + 1]
                below = positions[k + 1]
                if child.inherits_parent_range:
                    positions[k] = below
                elif not child.position_iteration:  # dense child: p_child = p * N + coord
                    positions[k] = ir.Bin(
                        "/", below, ir.Var(self.sig.dim(space.vars[k + 1 - first]))
                    )
                else:
                    n, arr = searched[k + 1]
                    lo, hi = state.levels[n]
                    if cursors is not None:
                        cur = cursors[k + 1]
                        stmts.append(
                            ir.While(
                                ir.Bin(
                                    "<=", ir.Load(arr, ir.add(ir.Var(cur), ir.IntLit(1))), below
                                ),
                                ir.block(ir.Assign(ir.Var(cur), ir.add(ir.Var(cur), ir.IntLit(1)))),
                            )
                        )
                        positions[k] = ir.Var(cur)
                    else:
                        found = self.namer.fresh(f"p{access.name}{k + 1}")
                        stmts.append(
                            ir.Decl(ir.I64, found, ir.Call("search", (ir.Var(arr), lo, hi, below)))
                        )
                        positions[k] = ir.Var(found)
            for n, var in enumerate(space.vars):
                k = first + n
                expr = self._scheduled_expr(space, var, expr, ctx)
                level = fmt.levels[k]
                name = self.var_names[var]
                if level.position_iteration:
                    coord: ir.Expr = self._crd(Iterator(access, k), positions[k])
                elif k == 0:
                    coord = positions[k]
                else:
                    coord = ir.Bin("%", positions[k], ir.Var(self.sig.dim(var)))
                stmts.append(ir.Decl(ir.I64, name, coord))
                pos = positions[k]
                ctx = ctx.bind(
                    {var: ir.Var(name)},
                    {(access, k): Bound(pos, ir.Bin("+", pos, ir.IntLit(1)))},
                )
                located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
                stmts.append(located)
        return ir.block(*stmts, self.loops(rest, expr, ctx, sink))

    def _scheduled_expr(self, space: Space, var: str, expr: CExpr, ctx: Ctx) -> CExpr:
        """The expression once ``var`` is bound by a schedule space: its lattice must be
        a plain range (dense spaces) or iterate only the pos tensor (position spaces)."""
        lattice = build(expr, lambda a: self._iterator(a, var, ctx), self.exact)
        if not lattice.points:
            return ZERO
        its = ordered(lattice.iterators)
        if space.kind in ("dense", "fused"):
            if its:
                a = its[0].access
                raise ScheduleError(
                    f"{space.origin}: {var} is iterated through {a}'s "
                    f"{self.formats[a.name].levels[its[0].level].spelling!r} level, so its "
                    f"loop is not a plain range; iterate its positions with "
                    f"pos({var},{var}pos,{a.name}) and transform that"
                )
            return lattice.points[0].expr
        others = [it for it in its if it.access.name != space.tensor]
        if others:
            raise ScheduleError(
                f"{space.origin}: at {var}, {others[0].access} is also sparse; pos visits "
                f"{space.tensor}'s stored positions alone, so the other operands must be dense "
                f"at {var}"
            )
        if its and any(its[0] not in p.iterators for p in lattice.points):
            raise ScheduleError(
                f"{space.origin}: the expression needs {var} where {space.tensor} has no "
                f"entry (a sum with a term without {space.tensor}); pos visits only "
                f"{space.tensor}'s entries"
            )
        return lattice.points[0].expr

    # ------------------------------------------------------------ loop nests
    @contextmanager
    def _private_accumulator(self) -> Generator[None, None, None]:
        """Lowering into an accumulator declared here: the parallel loops around it give
        each thread its own copy, so only loops inside may make its updates atomic (a
        CPUThread loop with Atomics). On the GPU an atomic on a local is illegal."""
        saved, self.atomic_writes = self.atomic_writes, False
        try:
            yield
        finally:
            self.atomic_writes = saved

    def _private_loops(
        self, order: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: AccSink
    ) -> ir.Block:
        with self._private_accumulator():
            return self.loops(order, expr, ctx, sink)

    def loops(
        self,
        order: tuple[str, ...],
        expr: CExpr,
        ctx: Ctx,
        sink: Sink,
        outermost: bool = False,
    ) -> ir.Block:
        """Code computing ``Σ order . expr`` (over the not-yet-bound ``order``) into ``sink``."""
        if expr is ZERO:
            self._nothing_written(sink)
            return ir.Block()
        if (
            order
            and isinstance(sink, OutputSink)
            and not self._binds(order) & set(self.lhs.indices)
            and ctx.depth(self.lhs) == self.lhs.order
        ):
            acc = self.namer.fresh("acc")
            if self.assembler is None:
                with self._private_accumulator():
                    inner = self.loops(order, expr, ctx, AccSink(acc), outermost)
                shared = acc in self.warp_reduced or acc in self.partial_accs
                store = self._store_shared(acc, ctx) if shared else [self._write(ctx, ir.Var(acc))]
                return ir.block(ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)), inner, *store)
            # sparse output: an entry exists only if some term reached it
            reached = self.namer.fresh("reached")
            counting = self.assembler.counting
            return ir.block(
                None if counting else ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)),
                ir.Decl(ir.BOOL, reached, ir.IntLit(0)),
                self._private_loops(order, expr, ctx, AccSink("" if counting else acc, reached)),
                ir.If(((ir.Var(reached), self._write(ctx, None if counting else ir.Var(acc))),)),
            )
        if not order:
            return self.compute(expr, ctx, sink)
        var, rest = order[0], order[1:]
        if self.where is not None and var == self.where.at and not self.in_where:
            return self._emit_where(order, expr, ctx, sink)
        if self.plan is not None and self.plan.space_of(var) is not None:
            return self._space_loop(var, rest, expr, ctx, sink, outermost)
        lattice = build(expr, lambda a: self._iterator(a, var, ctx), self.exact)
        if not lattice.points:
            self._nothing_written(sink)
            return ir.Block()
        return self.merge(var, rest, lattice, ctx, sink, outermost)

    def _store_shared(self, acc: str, ctx: Ctx) -> list[ir.Stmt]:
        """Store an accumulator that GPU loops in its scope share; each loop's strategy
        decides one step, from the innermost out. Lanes with ParallelReduction add their
        parts up by shuffles (lane 0 keeps the warp's sum). Then, where any loop in the
        scope has Atomics (its threads, warps or blocks each hold a part), every holder
        adds its part atomically into the output, which is zeroed before the launch;
        otherwise lane 0 stores the whole sum."""
        reduced = acc in self.warp_reduced
        self._one_store_per_part(self.acc_units.get(acc), reduced)
        flag = "partial" if acc in self.partial_accs else "lane0"
        store = self._write_with(flag, ctx, ir.Var(acc))
        if not reduced:
            return [store]
        return [
            ir.Assign(ir.Var(acc), ir.Call("warp_sum", (ir.Var(acc),))),
            ir.If(((ir.Bin("==", ir.Call("lane", ()), ir.IntLit(0)), store),)),
        ]

    def _nothing_written(self, sink: Sink) -> None:
        """A branch that stores nothing: the output must then be zeroed up front."""
        if isinstance(sink, OutputSink):
            self.write_sites.append(False)

    def _iterator(self, access: Access, var: str, ctx: Ctx) -> Iterator | None:
        levels = level_indices(access, self.formats[access.name])
        if var not in levels:
            return None
        k = levels.index(var)
        if not self.formats[access.name].levels[k].position_iteration:
            return None
        if ctx.depth(access) != k:
            raise LoweringError(f"internal: level {k + 1} of {access} iterated before its parent")
        return Iterator(access, k)

    # ------------------------------------------------------------ co-iterate
    def merge(
        self,
        var: str,
        rest: tuple[str, ...],
        lattice: Lattice,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        iterators = lattice.iterators
        name = self.var_names[var]
        if lattice.full and not iterators:
            return self._dense_loop(var, rest, lattice.points[0], ctx, sink, outermost)
        if len(iterators) == 1 and len(lattice.points) == 1:
            return self._position_loop(var, rest, lattice.points[0], ctx, sink, outermost)

        names = ", ".join(sorted({str(it.access) for it in iterators}))
        self._loop_setup(
            var, frozenset({var}), ctx, sink, f"it co-iterates {names}", ir.IntLit(0), False
        )
        gallop = self.plan is not None and self.plan.mergeby.get(var) == "Gallop"
        if gallop and (lattice.full or len(lattice.points) != 1):
            raise ScheduleError(
                f"mergeby({var},Gallop): the loop over {var} merges {names} as a union "
                "(some terms need only one of them); galloping skips ahead in an "
                "intersection only"
            )
        state = {it: self._iterator_state(it, ctx) for it in iterators}
        init = [ir.Decl(ir.I64, s.pos, s.lo) for s in state.values()]
        init += [ir.Decl(ir.I64, s.end, s.hi) for s in state.values()]
        if lattice.full:
            loop_body = self._dense_case_body(var, rest, lattice, lattice.points, state, ctx, sink)
            loop = ir.For(name, ir.IntLit(0), ir.Var(self.sig.dim(var)), loop_body)
            return ir.block(*init, loop)
        loops: list[ir.Stmt] = []
        # each step of the merge advances an iterator and appends at most one entry
        room: ir.Expr = ir.IntLit(0)
        for st in state.values():
            room = ir.add(room, ir.Bin("-", ir.Var(st.end), ir.Var(st.pos)))
        with self._capacity_checked(var, room) as check:
            loops += self._merge_loops(var, rest, lattice, state, ctx, sink, gallop)
        return ir.block(*init, *check, *loops)

    def _merge_loops(
        self,
        var: str,
        rest: tuple[str, ...],
        lattice: Lattice,
        state: dict[Iterator, _IterState],
        ctx: Ctx,
        sink: Sink,
        gallop: bool,
    ) -> list[ir.Stmt]:
        """One while loop per lattice point, each while all its iterators have entries."""
        name = self.var_names[var]
        loops: list[ir.Stmt] = []
        for top in lattice.points:
            its = ordered(top.iterators)
            cond = ir.conj(
                *(ir.Bin("<", ir.Var(state[it].pos), ir.Var(state[it].end)) for it in its)
            )
            reads: list[ir.Stmt] = [
                ir.Decl(ir.I64, state[it].coord, self._crd(it, ir.Var(state[it].pos))) for it in its
            ]
            coord: ir.Expr = ir.Var(state[its[0]].coord)
            for it in its[1:]:
                coord = ir.Call("min", (coord, ir.Var(state[it].coord)))
            reads.append(ir.Decl(ir.I64, name, coord))
            target = None
            if gallop:
                top_coord: ir.Expr = ir.Var(state[its[0]].coord)
                for it in its[1:]:
                    top_coord = ir.Call("max", (top_coord, ir.Var(state[it].coord)))
                target = self.namer.fresh(f"{name}_max")
                reads.append(ir.Decl(ir.I64, target, top_coord))
            body = self._dense_case_body(
                var, rest, lattice, lattice.sub_points(top), state, ctx, sink, its, reads, target
            )
            loops.append(ir.While(cond, body))
        return loops

    def _dense_case_body(
        self,
        var: str,
        rest: tuple[str, ...],
        lattice: Lattice,
        cases: tuple[LatticePoint, ...],
        state: dict[Iterator, _IterState],
        ctx: Ctx,
        sink: Sink,
        live: list[Iterator] | None = None,
        reads: list[ir.Stmt] | None = None,
        gallop_to: str | None = None,
    ) -> ir.Block:
        """One step of co-iteration: which iterators sit at ``var``, the cases, advancing.

        In a dense loop (``live`` is None) every iterator may be exhausted, so presence is
        ``p < end && crd[p] == var``; in a while loop the condition guarantees positions.
        """
        name = self.var_names[var]
        its = live if live is not None else ordered(lattice.iterators)
        stmts: list[ir.Stmt] = list(reads or [])
        for it in its:
            s = state[it]
            if live is None:
                here = ir.conj(
                    ir.Bin("<", ir.Var(s.pos), ir.Var(s.end)),
                    ir.Bin("==", self._crd(it, ir.Var(s.pos)), ir.Var(name)),
                )
            else:
                here = ir.Bin("==", ir.Var(s.coord), ir.Var(name))
            stmts.append(ir.Decl(ir.BOOL, s.here, here))
            stmts.extend(self._segment(it, s, ir.Var(name)))
        branches: list[tuple[ir.Expr, ir.Block]] = []
        orelse: ir.Block | None = None
        for point in cases:
            body = self._case(var, rest, point, state, ctx, sink)
            if point.iterators:
                cond = ir.conj(*(ir.Var(state[it].here) for it in ordered(point.iterators)))
                branches.append((cond, body))
            else:
                orelse = body
                break
        if branches:
            stmts.append(ir.If(tuple(branches), orelse))
        elif orelse is not None:
            stmts.extend(orelse.body)
        if gallop_to is not None:
            # an intersection: all present → step on; else every iterator gallops to the
            # largest current coordinate (a present one is already there)
            everyone = ir.conj(*(ir.Var(state[it].here) for it in its))
            for it in its:
                s = state[it]
                crd = self.sig.array(it.access.name, "crd", it.level)
                jump = ir.Call(
                    "gallop", (ir.Var(crd), ir.Var(s.pos), ir.Var(s.end), ir.Var(gallop_to))
                )
                stmts.append(ir.Assign(ir.Var(s.pos), ir.Select(everyone, s.advance, jump)))
            return ir.block(*stmts)
        counting = self.assembler is not None and self.assembler.counting
        for it in its:
            s = state[it]
            if counting and self._unique(it):
                # no values are read while counting: advance without a branch (a merge's
                # branches are unpredictable; GCC keeps them for the select otherwise)
                step: ir.Expr = ir.Bin("+", ir.Var(s.pos), ir.Var(s.here))
            else:
                step = ir.Select(ir.Var(s.here), s.advance, ir.Var(s.pos))
            stmts.append(ir.Assign(ir.Var(s.pos), step))
        return ir.block(*stmts)

    def _segment(
        self, it: Iterator, s: _IterState, coord: ir.Expr, guarded: bool = True
    ) -> list[ir.Stmt]:
        """For a non-unique level: find the end of the run of equal coordinates (only when
        the iterator is present at ``coord``, unless ``guarded`` is off)."""
        if self._unique(it):
            return []
        nxt = ir.Var(s.next)
        guard = [ir.Var(s.here)] if guarded else []
        scan = ir.While(
            ir.conj(
                *guard,
                ir.Bin("<", nxt, ir.Var(s.end)),
                ir.Bin("==", self._crd(it, nxt), coord),
            ),
            ir.block(ir.Assign(nxt, ir.Bin("+", nxt, ir.IntLit(1)))),
        )
        return [ir.Decl(ir.I64, s.next, ir.Bin("+", ir.Var(s.pos), ir.IntLit(1))), scan]

    def _case(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        state: dict[Iterator, _IterState],
        ctx: Ctx,
        sink: Sink,
    ) -> ir.Block:
        levels = {
            (it.access, it.level): Bound(ir.Var(state[it].pos), state[it].advance)
            for it in point.iterators
        }
        inner = ctx.bind({var: ir.Var(self.var_names[var])}, levels)
        return self._enter(var, rest, point.expr, inner, sink)

    def _enter(
        self, var: str, rest: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: Sink
    ) -> ir.Block:
        """Code for the body of one iteration that has just bound ``var``."""
        level = self.assembler.level_of(var) if self.assembler else None
        if self.assembler is None or level is None:
            located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
            return ir.block(located, self.loops(rest, expr, ctx, sink))
        if var == self.workspace:
            located, ctx = self._locate(ctx, list(accesses(expr)))
            return ir.block(located, self.loops(rest, expr, ctx, sink))
        slot = self.assembler.bind(level)
        if slot is not None:
            ctx = ctx.bind(levels={(self.lhs, level): Bound(slot, ir.Bin("+", slot, ir.IntLit(1)))})
        known = ctx.depth(self.lhs)
        located, ctx = self._locate(ctx, [self.lhs, *accesses(expr)])
        # the dense levels above the first sparse one may be bound in any order (rowwise
        # outputs): a row starts where the last of them is located, whichever var that is
        row = self.assembler.layout.dense_prefix - 1
        if known <= row < ctx.depth(self.lhs):
            level = row
        bound = ctx.levels.get((self.lhs, level))
        before, after = self.assembler.around(level, bound.pos if bound else None)
        if self.workspace and level == self.assembler.layout.last - 1 and bound is not None:
            inner = self._scatter_gather(rest, expr, ctx)
        else:
            inner = self.loops(rest, expr, ctx, sink)
        return ir.block(located, *before, inner, *after)

    def _scatter_gather(self, rest: tuple[str, ...], expr: CExpr, ctx: Ctx) -> ir.Block:
        """Scatter the remaining loops into the workspace, then append its sorted row."""
        assert self.assembler is not None
        return ir.block(self.loops(rest, expr, ctx, WorkspaceSink()), *self.assembler.gather())

    @contextmanager
    def _capacity_checked(self, var: str, room: ir.Expr) -> Generator[list[ir.Stmt]]:
        """Lower a loop body under one up-front capacity check when the loop appends the
        output's last level (`Assembler.precheck`); yields the check's statements."""
        asm = self.assembler
        check = asm.precheck(var, room) if asm is not None else []
        if asm is None or not check:
            yield check
            return
        saved, asm.checked = asm.checked, True
        try:
            yield check
        finally:
            asm.checked = saved

    def _dense_loop(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        name = self.var_names[var]
        trip = ir.Var(self.sig.dim(var))
        setup = self._loop_setup(var, frozenset({var}), ctx, sink, "for", trip, outermost)
        inner = ctx.bind({var: ir.Var(name)}, covered=var)
        with self._capacity_checked(var, trip) as check:
            body = self._inside(setup, lambda: self._enter(var, rest, point.expr, inner, sink))
        if outermost and self.zero_in_loop:
            body = ir.block(self._zero_slice(ir.Var(name)), body)
        loop = ir.For(name, ir.IntLit(0), trip, body, setup.parallel, setup.unroll)
        return ir.block(*setup.pre, *check, loop, *setup.post)

    def _position_loop(
        self,
        var: str,
        rest: tuple[str, ...],
        point: LatticePoint,
        ctx: Ctx,
        sink: Sink,
        outermost: bool,
    ) -> ir.Block:
        (it,) = point.iterators
        s = self._iterator_state(it, ctx)
        name = self.var_names[var]
        pos = ir.Var(s.pos)
        read = ir.Decl(ir.I64, name, self._crd(it, pos))
        if self._unique(it):
            levels = {(it.access, it.level): Bound(pos, ir.Bin("+", pos, ir.IntLit(1)))}
            inner = ctx.bind({var: ir.Var(name)}, levels)
            end = ir.Decl(ir.I64, s.end, s.hi)
            trip = ir.Bin("-", ir.Var(s.end), s.lo)
            setup = self._loop_setup(var, frozenset({var}), ctx, sink, "for", trip, outermost)
            with self._capacity_checked(var, trip) as check:
                body = self._inside(
                    setup, lambda: ir.block(read, self._enter(var, rest, point.expr, inner, sink))
                )
            loop = ir.For(s.pos, s.lo, ir.Var(s.end), body, setup.parallel, setup.unroll)
            return ir.block(end, *setup.pre, *check, loop, *setup.post)
        # Non-unique level: walk runs of equal coordinates; children see [p, next).
        self._loop_setup(
            var,
            frozenset({var}),
            ctx,
            sink,
            f"it walks runs of equal coordinates of {it.access}'s non-unique level",
            ir.IntLit(0),
            False,
        )
        levels = {(it.access, it.level): Bound(pos, ir.Var(s.next))}
        inner = ctx.bind({var: ir.Var(name)}, levels)
        body = ir.block(
            read,
            *self._segment(it, s, ir.Var(name), guarded=False),
            self._enter(var, rest, point.expr, inner, sink),
            ir.Assign(pos, ir.Var(s.next)),
        )
        return ir.block(
            ir.Decl(ir.I64, s.pos, s.lo),
            ir.Decl(ir.I64, s.end, s.hi),
            ir.While(ir.Bin("<", pos, ir.Var(s.end)), body),
        )

    # ------------------------------------------------------------- iterators
    def _iterator_state(self, it: Iterator, ctx: Ctx) -> _IterState:
        t, k = it.access.name, it.level
        fmt = self.formats[t].levels[k]
        parent = ctx.levels.get((it.access, k - 1)) if k > 0 else None
        if fmt.inherits_parent_range:
            assert parent is not None
            lo, hi = parent.pos, parent.next
        else:
            ppos = parent.pos if parent else ir.IntLit(0)
            pos_arr = self.sig.array(t, "pos", k)
            lo = ir.Load(pos_arr, ppos)
            hi = ir.Load(pos_arr, ir.add(ppos, ir.IntLit(1)))
        var = level_indices(it.access, self.formats[t])[k]
        p = self.namer.fresh(f"p{t}{k + 1}")
        nxt = self.namer.fresh(f"{p}_next") if not fmt.unique else ""
        here = self.namer.fresh(f"{var}{t}_here")
        advance = ir.Var(nxt) if nxt else ir.Bin("+", ir.Var(p), ir.IntLit(1))
        return _IterState(
            pos=p,
            end=self.namer.fresh(f"{p}_end"),
            coord=self.namer.fresh(f"{var}{t}"),
            here=here,
            next=nxt,
            lo=lo,
            hi=hi,
            advance=advance,
        )

    def _crd(self, it: Iterator, pos: ir.Expr) -> ir.Expr:
        return ir.Load(self.sig.array(it.access.name, "crd", it.level), pos)

    def _unique(self, it: Iterator) -> bool:
        return self.formats[it.access.name].levels[it.level].unique

    # ---------------------------------------------------------------- locate
    def _locate(self, ctx: Ctx, accs: list[Access]) -> tuple[ir.Block, Ctx]:
        """Compute positions of dense levels whose coordinate and parent are known."""
        decls: list[ir.Stmt] = []
        for access in dict.fromkeys(accs):
            fmt = self.formats[access.name]
            levels = level_indices(access, fmt)
            k = ctx.depth(access)
            while k < len(levels) and fmt.levels[k].locate and levels[k] in ctx.coords:
                parent = ctx.levels[(access, k - 1)].pos if k > 0 else None
                coord = ctx.coords[levels[k]]
                pos = (
                    coord
                    if parent is None
                    else ir.add(ir.mul(parent, ir.Var(self.sig.dim(levels[k]))), coord)
                )
                p = self.namer.fresh(f"p{access.name}{k + 1}")
                decls.append(ir.Decl(ir.I64, p, pos))
                ctx = ctx.bind(
                    levels={(access, k): Bound(ir.Var(p), ir.Bin("+", ir.Var(p), ir.IntLit(1)))}
                )
                k += 1
        return ir.block(*decls), ctx

    # --------------------------------------------------------------- compute
    def _output_slot(self, ctx: Ctx) -> ir.Load:
        vals = self.out_redirect or self.sig.array(self.lhs.name, "vals")
        if self.lhs.order == 0:
            return ir.Load(vals, ir.IntLit(0))
        return ir.Load(vals, ctx.levels[(self.lhs, self.lhs.order - 1)].pos)

    def compute(self, expr: CExpr, ctx: Ctx, sink: Sink) -> ir.Block:
        """The innermost statement: add the value of ``expr`` into ``sink``.

        When only counting a sparse output's positions, no value is computed.
        """
        stmts: list[ir.Stmt] = []
        counting = self.assembler is not None and self.assembler.counting
        # the flags of this statement's nested sums (their bodies store through here too)
        outer_reached, self.reached_of = self.reached_of, {}
        value = None if counting else self.value(expr, ctx, stmts)
        # a sparse output has an entry only where some term is present
        present = None if self.assembler is None else self._presence(expr, ctx, stmts)
        match sink:
            case OutputSink():
                stmts.append(_when(present, self._write(ctx, value)))
            case AccSink(name=name, flag=flag):
                if value is not None:
                    stmts.append(ir.Assign(ir.Var(name), value, "+=", atomic=self.atomic_writes))
                if flag:
                    stmts.append(_when(present, ir.block(ir.Assign(ir.Var(flag), ir.IntLit(1)))))
            case SegmentSink(acc=acc, at=at):
                assert value is not None
                self._one_store_per_part()
                self.write_sites.append(False)
                slot = self._output_slot(ctx).index
                restart = ir.block(
                    self._flush_run(sink),
                    ir.Assign(ir.Var(at), slot),
                    ir.Assign(ir.Var(acc), ir.FloatLit(0.0)),
                )
                stmts.append(ir.If(((ir.Bin("!=", slot, ir.Var(at)), restart),)))
                stmts.append(ir.Assign(ir.Var(acc), value, "+="))
            case DenseWsSink(array=array, var=var):
                assert value is not None
                stmts.append(ir.Assign(ir.Load(array, ctx.coords[var]), value, "+="))
            case WorkspaceSink():
                assert self.assembler is not None and self.workspace is not None
                coord = ir.Var(self.var_names[self.workspace])
                stmts.append(_when(present, ir.block(*self.assembler.scatter(coord, value))))
        self.reached_of = outer_reached
        return ir.block(*stmts)

    def _presence(self, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr | None:
        """Whether a term of ``expr`` is structurally present at a sparse output's entry
        (None: surely). The accesses of a case's expression are present (the lattice
        chose the case) and so are literals; a nested sum is present where its loops
        reached a term (when counting, no value was computed, so its loops run here for
        that alone); ``*`` needs both operands, ``+`` and ``-`` either; a division by a
        non-literal is present everywhere (``0/0`` is NaN)."""
        if _surely_present(expr):
            return None
        match expr:
            case Neg(operand=x):
                return self._presence(x, ctx, stmts)
            case Sum():
                if expr not in self.reached_of:
                    stmts.extend(self._nested_sum(expr, ctx, ""))
                return ir.Var(self.reached_of[expr])
            case BinOp(op="*", left=left, right=right):
                parts = (self._presence(left, ctx, stmts), self._presence(right, ctx, stmts))
                return ir.conj(*(p for p in parts if p is not None))
            case BinOp(op="+" | "-", left=left, right=right):
                first, second = self._presence(left, ctx, stmts), self._presence(right, ctx, stmts)
                assert first is not None and second is not None
                return ir.Bin("||", first, second)
            case BinOp(op="/", left=left):
                return self._presence(left, ctx, stmts)
            case _:
                raise AssertionError(expr)

    def _nested_sum(self, expr: Sum, ctx: Ctx, acc: str) -> list[ir.Stmt]:
        """The loops of a nested sum adding into ``acc`` (``""``: counting, no value). For
        a sparse output they also set a flag when they reach a term (`reached_of`)."""
        order = loop_order(expr.indices, list(accesses(expr.body)), self.formats, tuple(ctx.coords))
        stmts: list[ir.Stmt] = []
        flag = ""
        if self.assembler is not None:
            flag = self.reached_of[expr] = self.namer.fresh("reached")
            stmts.append(ir.Decl(ir.BOOL, flag, ir.IntLit(0)))
        return stmts + list(self._private_loops(order, expr.body, ctx, AccSink(acc, flag)).body)

    def value(self, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr:
        """The IR value of ``expr`` with every variable bound; nested sums emit into ``stmts``."""
        match expr:
            case Access(name=name, order=0):
                return ir.Var(self.sig.value(name))
            case Access():
                last = ctx.levels.get((expr, expr.order - 1))
                if last is None:
                    raise LoweringError(f"internal: {expr} read before all its levels are bound")
                vals = self.local_vals.get(expr.name) or self.sig.array(expr.name, "vals")
                return ir.Load(vals, last.pos)
            case Literal(value=v):
                return ir.FloatLit(v)
            case Zero():
                return ir.FloatLit(0.0)
            case Neg(operand=x):
                return ir.Unary("-", self.value(x, ctx, stmts))
            case BinOp(op=op, left=left, right=right):
                return ir.Bin(op, self.value(left, ctx, stmts), self.value(right, ctx, stmts))
            case Sum():
                t = self.namer.fresh("t")
                stmts.append(ir.Decl(ir.ACC, t, ir.FloatLit(0.0)))
                stmts.extend(self._nested_sum(expr, ctx, t))
                return ir.Var(t)
            case _:
                raise AssertionError(expr)


def _surely_present(expr: CExpr) -> bool:
    """A term of ``expr`` is present whatever its nested sums reach (see `_presence`).
    A `Zero` (an absent operand that exact lowering reads as ``0.0``, where ``inf * 0``
    is NaN) is present as the lattice's exact points are."""
    match expr:
        case Access() | Literal() | Zero():
            return True
        case Sum():
            return False
        case Neg(operand=x):
            return _surely_present(x)
        case BinOp(op="*", left=left, right=right):
            return _surely_present(left) and _surely_present(right)
        case BinOp(op="+" | "-", left=left, right=right):
            return _surely_present(left) or _surely_present(right)
        case BinOp(op="/", left=left, right=right):
            literal = isinstance(right, Literal) and right.value != 0
            return not literal or _surely_present(left)
        case BinOp(op=op):
            raise AssertionError(f"unknown operator {op}")
        case _:
            assert_never(expr)


def _when(cond: ir.Expr | None, then: ir.Stmt) -> ir.Stmt:
    """``then``, run only where ``cond`` holds (always when None)."""
    return then if cond is None else ir.If(((cond, ir.block(then)),))


def _product(parts: list[Access | Literal] | tuple[Access | Literal, ...]) -> CExpr:
    expr: CExpr = parts[0]
    for p in parts[1:]:
        expr = BinOp("*", expr, p, (0, 0))  # type: ignore[arg-type]
    return expr


def _factor_of(plan: Plan, loop: str, default: int) -> int:
    """The split factor of an inner split piece (the extent of its loop), else ``default``."""
    piece = plan.pieces.get(loop)
    if piece is not None and not piece.outer and not piece.divide:
        return piece.factor
    return default


def _origin_of(plan: Plan, loop: str) -> str:
    if loop in plan.pieces:
        return f"from {plan.pieces[loop].origin}"
    return f"from {plan.spaces[loop].origin}"


@dataclass
class _LoopSetup:
    """How one loop runs (see `Lowerer._loop_setup`)."""

    parallel: ir.Parallel | None = None
    unroll: int = 0
    #: statements before the loop, at the start of its body, and after it
    pre: list[ir.Stmt] = field(default_factory=list)
    body_pre: list[ir.Stmt] = field(default_factory=list)
    post: list[ir.Stmt] = field(default_factory=list)
    #: lowerer attributes set while its body is lowered
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Where:
    """A dense precompute: ``ws(var) = producer`` then ``consumer`` reads ``ws``."""

    at: str
    var: str
    producer_order: tuple[str, ...]
    consumer_order: tuple[str, ...]
    produce: tuple[Access | Literal, ...]
    workspace: Access
    base: str
    origin: str


@dataclass(frozen=True, slots=True)
class _IterState:
    """Names of one iterator's variables in one co-iteration loop."""

    pos: str
    end: str
    coord: str
    here: str
    next: str
    lo: ir.Expr
    hi: ir.Expr
    advance: ir.Expr


def lower(
    spec: Spec,
    make_names: Callable[[], tuple[Signature, Namer]],
    *,
    parallel: bool = True,
    counting: bool = False,
    append: bool = False,
    commands: tuple[Command, ...] = (),
    target: str = "c",
) -> tuple[LoweredKernel, Signature]:
    """Lower ``spec``; a second pass drops the output zeroing when every element is
    written exactly once (plain dense loops over all output indices), storing with ``=``.

    ``make_names()`` returns a fresh ``(Signature, Namer)``, so both passes name alike.
    ``counting`` lowers the assemble kernel of a sparse output (sizes only); ``append``
    its single-pass kernel (serial, appending into arrays of a proven capacity, even where
    the two-phase kernel fills rows in parallel); ``commands`` is the user's schedule
    (empty: the default schedule).
    """
    sig, namer = make_names()
    options: dict[str, Any] = {"parallel": parallel, "commands": commands, "target": target}
    if not spec.output.format.is_dense:
        lowered = Lowerer(spec, sig, namer, counting=counting, append=append, **options).kernel()
        return lowered, sig
    first = Lowerer(spec, sig, namer, **options).kernel()
    if not first.exclusive:
        return first, sig
    sig, namer = make_names()
    return Lowerer(spec, sig, namer, exclusive=True, **options).kernel(), sig
