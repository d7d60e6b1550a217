"""Assembly of sparse outputs: the kernel builds the output's pos/crd/vals itself.

Two kernels come from one lowering: ``assemble`` (symbolic) walks the loop nest and
only counts the positions of every output level, which it reports in ``sc_sizes``; the
runtime allocates exact arrays; ``compute`` (numeric) walks it again and appends.

Appending needs the output's sparse levels visited in order, so the iteration graph puts
their index variables first, in level order, before every reduction (`order.py`). Then
each level is handled where its variable is bound:

* a dense level directly above a compressed one records ``pos[p + 1] = count`` after its
  iteration (a prefix-max at the end fills the entries of parents never visited);
* a compressed level that is not the last records the child count before its body and
  appends its coordinate afterwards if the body appended anything below;
* the last compressed level (or COO's non-unique level and its singletons) appends at the
  store, once per output entry; dense levels below it form a block per entry that is
  zeroed before and kept only if something was stored into it.

An entry exists exactly where at least one term of the expression is structurally present
(a lattice case ran); values that cancel numerically (``B - B``) are kept as explicit
zeros, as in TACO.
"""

from __future__ import annotations

from ..abi import CAPACITY_EXCEEDED, CHUNK_PARAM, GPU_HASH, GPU_WORKSPACE, Namer, Signature
from ..frontend.notation import Access
from ..ir import nodes as ir
from ..middle.order import level_indices
from ..middle.spec import TensorVar
from ..tensors.formats import Dense, LevelFormat, LevelNames, dense_extent
from ..tensors.layout import AssemblyMode, OutputLayout
from .chunks import ChunkFrame, Table
from .workspace import Workspace, allocate


class Assembler:
    """Generates the output-assembly statements for one kernel, in one `AssemblyMode`.

    It knows the output, the kernel's names (``sig``, ``namer``) and the C name of each
    index variable (``var_names``), and nothing of the lowering that calls it."""

    def __init__(
        self,
        out: TensorVar,
        lhs: Access,
        sig: Signature,
        namer: Namer,
        var_names: dict[str, str],
        mode: AssemblyMode,
    ) -> None:
        self.sig = sig
        self.namer = namer
        self.var_names = var_names
        self.lhs = lhs
        self.name = out.name
        self.layout = OutputLayout.of(out.format, out.name)
        #: the phase asked for, made this layout's (`AssemblyMode.of`)
        self.mode = AssemblyMode.of(self.layout, mode)
        self.levels: tuple[LevelFormat, ...] = out.format.levels
        self.vars = level_indices(self.lhs, out.format)
        appended = (*self.layout.inner, self.layout.last)
        #: position counter per appended level (the next free position)
        self.count = {k: namer.fresh(f"p{self.name}{k + 1}") for k in appended}
        self.pos = {k: sig.array(self.name, "pos", k) for k in appended}
        self.crd = {k: sig.array(self.name, "crd", k) for k in (*appended, *self.layout.tail)}
        self.vals = sig.array(self.name, "vals")
        self.sizes = sig.sizes
        self.touched = namer.fresh("stored") if self.layout.block else ""
        #: a chunk's table index (`chunks`): this function appends one chunk's rows
        #: (``sc_chunk``) into its region, from its counter's start to its end
        self.chunks = namer.fresh("chunks") if self.mode.chunked else ""
        #: each appended level's capacity, read from ``sc_sizes`` (where the mode checks it)
        self.capacity = (
            {k: namer.fresh(f"cap{self.name}{k + 1}") for k in appended}
            if self.mode.checks_capacity
            else {}
        )
        #: the Gustavson workspace, once `workspace_alloc` made one, and its allocation
        self.ws: Workspace | None = None
        self.ws_alloc: list[ir.Stmt] = []

    # --------------------------------------------------------------- helpers
    def _at(self, k: int) -> LevelNames:
        """The kernel's names for output level ``k`` (its level functions' arguments)."""
        return LevelNames(self._dim(k), self.pos.get(k, ""), self.crd.get(k, ""))

    def _store(self, array: str, index: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
        return [] if self.mode.counting else [ir.Assign(ir.Load(array, index), value)]

    def _append_coord(self, k: int, at: ir.Expr) -> list[ir.Stmt]:
        """Level ``k``'s coordinate at its appended position ``at`` (not when counting)."""
        return (
            []
            if self.mode.counting
            else self.levels[k].append_coord(at, self._coord(k), self._at(k))
        )

    def _room(self, k: int, slack: bool = False) -> list[ir.Stmt]:
        """Leave the kernel before appending past level ``k``'s capacity (``slack``: the
        position one past it may still be written: a dense block's spare, see `abi.BLOCK_SLACK`)."""
        if k not in self.capacity:
            return []
        full = ir.Bin(">" if slack else ">=", ir.Var(self.count[k]), ir.Var(self.capacity[k]))
        return self._bail(full)

    def precheck(self, var: str, room: ir.Expr) -> list[ir.Stmt]:
        """Before a loop that binds the output's last level and appends at most ``room``
        entries (one per iteration): a single capacity check for the whole loop, after
        which its stores skip their own (``checked``). A check per append costs a merge
        about a tenth of its time. Empty when the level's entries are not appended one
        per iteration (COO's singletons, dense blocks) or are gathered from a workspace.

        The loop appends at most ``min(room, extent)`` distinct coordinates. The runtime
        gives the last level `abi.LAST_LEVEL_SLACK` extents beyond its bound, so a correct
        bound never fails this check, however loosely ``room`` counts."""
        layout = self.layout
        if (
            not self.mode.single_pass
            or self.level_of(var) != layout.last
            or layout.last not in self.capacity
            or not layout.one_entry_per_step
            or self.ws is not None
        ):
            return []
        c = ir.Var(self.count[layout.last])
        most = ir.Call("min", (room, self._dim(layout.last)))
        return self._bail(ir.Bin(">", ir.Bin("+", c, most), ir.Var(self.capacity[layout.last])))

    def _bail(self, cond: ir.Expr) -> list[ir.Stmt]:
        """Leave with CAPACITY_EXCEEDED when ``cond`` holds, freeing the workspace."""
        frees = self.ws.free() if self.ws is not None else []
        return [ir.If(((cond, ir.block(*frees, ir.Return(CAPACITY_EXCEEDED, ir.IntLit(1)))),))]

    def _inc(self, k: int) -> ir.Stmt:
        c = ir.Var(self.count[k])
        return ir.Assign(c, ir.Bin("+", c, ir.IntLit(1)))

    def _coord(self, k: int) -> ir.Expr:
        return ir.Var(self.var_names[self.vars[k]])

    def _dim(self, k: int) -> ir.Expr:
        return self.sig.extent(self.vars[k])

    def _extent(self, levels: range | tuple[int, ...]) -> ir.Expr:
        """The positions of the dense ``levels`` under one parent position."""
        return dense_extent(self._dim(k) for k in levels)

    # -------------------------------------------------------------- kernel
    def opening(self) -> list[ir.Stmt]:
        """Before the loop nest (`output.epilogue`): the counters and ``pos`` started,
        then the workspace allocated."""
        return [*self.prologue(), *self.ws_alloc]

    def closing(self) -> list[ir.Stmt]:
        """After the loop nest: the workspace freed, then the sizes reported (counting)
        or ``pos`` completed."""
        return [*self.workspace_free(), *self.epilogue()]

    def prologue(self) -> list[ir.Stmt]:
        if self.mode.rowwise:
            return []
        if self.mode.chunked:  # the chunk's region, from the table after the sizes
            last, chunks, c = self.layout.last, ir.Var(self.chunks), ir.Var(CHUNK_PARAM)
            at = Table(self.sizes, len(self.levels), chunks)
            return [
                ir.Decl(ir.I64, self.chunks, ir.Load(self.sizes, ir.IntLit(len(self.levels)))),
                ir.Decl(ir.I64, self.count[last], at.region(c)),
                ir.Decl(ir.I64, self.capacity[last], at.region(ir.add(c, ir.IntLit(1)))),
            ]
        stmts: list[ir.Stmt] = [ir.Decl(ir.I64, c, ir.IntLit(0)) for c in self.count.values()]
        first = min(self.count)
        if self.mode.counting:
            return stmts
        for k, cap in self.capacity.items():
            stmts.append(ir.Decl(ir.I64, cap, ir.Load(self.sizes, ir.IntLit(k))))
        if first == 0:
            stmts += self._store(self.pos[0], ir.IntLit(0), ir.IntLit(0))
        else:
            p = self.namer.fresh("p")
            zero = ir.Assign(ir.Load(self.pos[first], ir.Var(p)), ir.IntLit(0))
            end = ir.Bin("+", self._extent(range(self.layout.dense_prefix)), ir.IntLit(1))
            stmts.append(ir.For(p, ir.IntLit(0), end, ir.block(zero)))
        for k in self.count:
            if k != first:
                stmts += self._store(self.pos[k], ir.IntLit(0), ir.IntLit(0))
        return stmts

    def epilogue(self) -> list[ir.Stmt]:
        if self.mode.rowwise:
            return []
        if self.mode.chunked:  # every row recorded its end; the chunk's end for the moves
            at = Table(self.sizes, len(self.levels), ir.Var(self.chunks))
            return [ir.Assign(at.end(ir.Var(CHUNK_PARAM)), ir.Var(self.count[self.layout.last]))]
        first = min(self.count)
        if self.mode.counting:
            stmts: list[ir.Stmt] = []
            for k, c in self.count.items():
                stmts.append(ir.Assign(ir.Load(self.sizes, ir.IntLit(k)), ir.Var(c)))
            for k in self.layout.tail:
                stmts.append(
                    ir.Assign(
                        ir.Load(self.sizes, ir.IntLit(k)), ir.Var(self.count[self.layout.last])
                    )
                )
            return stmts
        if first == 0:
            # the root's one segment ends at the count
            return [self.levels[0].append_edges(ir.IntLit(0), ir.Var(self.count[0]), self._at(0))]
        # parents never visited keep the count of the parent before them (prefix max)
        p = self.namer.fresh("p")
        pos = self.pos[first]
        here, before = ir.Load(pos, ir.Var(p)), ir.Load(pos, ir.Bin("-", ir.Var(p), ir.IntLit(1)))
        fix = ir.If(((ir.Bin("<", here, before), ir.block(ir.Assign(here, before))),))
        end = ir.Bin("+", self._extent(range(self.layout.dense_prefix)), ir.IntLit(1))
        return [ir.For(p, ir.IntLit(1), end, ir.block(fix))]

    # ------------------------------------------------------ around a level
    def level_of(self, var: str) -> int | None:
        return self.vars.index(var) if var in self.vars else None

    def bind(self, k: int) -> ir.Expr | None:
        """The position an appended level ``k`` takes while its body runs (its counter);
        COO's singleton levels share the position of their non-unique parent."""
        if k in self.count:
            return ir.Var(self.count[k])
        if k in self.layout.tail:
            return ir.Var(self.count[self.layout.last])
        return None

    def around(self, k: int, ctx_pos: ir.Expr | None) -> tuple[list[ir.Stmt], list[ir.Stmt]]:
        """Statements before and after the body of one iteration binding output level ``k``."""
        layout = self.layout
        before: list[ir.Stmt] = []
        after: list[ir.Stmt] = []
        if k == layout.dense_prefix - 1 and ctx_pos is not None and self.mode.rowwise:
            # one row: count its entries into pos[p + 1], or fill them from pos[p]
            last = layout.last
            row_count = self.count[last]
            row = self.levels[last]
            row_start, _ = row.bounds((ctx_pos, ctx_pos), self._at(last))
            before.append(
                ir.Decl(ir.I64, row_count, ir.IntLit(0) if self.mode.counting else row_start)
            )
            before += self.ws.row_slices(ctx_pos) if self.ws is not None else []
            if self.mode.counting:
                after.append(row.append_edges(ctx_pos, ir.Var(row_count), self._at(last)))
        elif k == layout.dense_prefix - 1 and ctx_pos is not None:
            # the dense parent of the first sparse level: record where its children end
            child = min(self.count)
            if not self.mode.counting:
                edges = self.levels[child].append_edges(
                    ctx_pos, ir.Var(self.count[child]), self._at(child)
                )
                after.append(edges)
        elif k in layout.inner:
            child = min(j for j in self.count if j > k)
            start = self.namer.fresh(f"{self.count[child]}_start")
            before.append(ir.Decl(ir.I64, start, ir.Var(self.count[child])))
            body = self._room(k) + self._append_coord(k, ir.Var(self.count[k]))
            body.append(self._inc(k))
            # after the increment the counter is the parent's position + 1: pos's slot
            body += self._store(self.pos[child], ir.Var(self.count[k]), ir.Var(self.count[child]))
            cond = ir.Bin(">", ir.Var(self.count[child]), ir.Var(start))
            after.append(ir.If(((cond, ir.block(*body)),)))
        elif k == layout.last and layout.block:
            c = ir.Var(self.count[k])
            before.append(ir.Decl(ir.BOOL, self.touched, ir.IntLit(0)))
            if not self.mode.counting:
                # the block at the next free position is zeroed before anything is known to
                # be stored in it, so vals has one spare block past the last kept entry
                before += self._room(k, slack=True)
                p = self.namer.fresh("p")
                block = LevelNames(self._extent(layout.block))
                at = Dense().locate_position(c, ir.Var(p), block)
                zero = ir.Assign(ir.Load(self.vals, at), ir.FloatLit(0.0))
                before.append(ir.For(p, ir.IntLit(0), block.dim, ir.block(zero)))
            body = self._room(k) + self._append_coord(k, c)
            body.append(self._inc(k))
            after.append(ir.If(((ir.Var(self.touched), ir.block(*body)),)))
        return before, after

    # --------------------------------------------------------------- store
    def store(self, slot: ir.Load, value: ir.Expr | None, checked: bool) -> list[ir.Stmt]:
        """One output entry at the innermost level (``value`` is None when counting;
        ``checked``: the enclosing loop checked the capacity up front, `precheck`)."""
        layout = self.layout
        if layout.block:
            stmts: list[ir.Stmt] = [ir.Assign(ir.Var(self.touched), ir.IntLit(1))]
            if value is not None and not self.mode.counting:
                stmts.append(ir.Assign(slot, value, "+="))
            return stmts
        c = ir.Var(self.count[layout.last])
        stmts = [] if self.mode.counting or checked else self._room(layout.last)
        for k in (layout.last, *layout.tail):
            stmts += self._append_coord(k, c)
        if value is not None:
            stmts += self._store(self.vals, c, value)
        stmts.append(self._inc(layout.last))
        return stmts

    # ------------------------------------------------------------ workspace
    def workspace_alloc(self, var: str | None, gpu: bool = False) -> None:
        """The workspace over ``var`` (see `workspace`), if any, before the loop nest is
        lowered: one per kernel, or one per thread when rows are filled in parallel (each
        row takes its thread's slice). `opening` allocates it."""
        if var is None:
            return
        copies = ir.Var(self.sig.threads) if self.mode.rowwise else None
        size = self.sig.extent(var)
        roles = {**GPU_WORKSPACE, **GPU_HASH}
        given = {role: name for role, (name, _) in roles.items()} if gpu else None
        self.ws, self.ws_alloc = allocate(var, size, self.namer, self.mode.counting, copies, given)

    def workspace_free(self) -> list[ir.Stmt]:
        return self.ws.free() if self.ws is not None else []

    def scatter(self, coord: ir.Expr, value: ir.Expr | None) -> list[ir.Stmt]:
        assert self.ws is not None
        return self.ws.scatter(coord, value)

    def gather(self) -> list[ir.Stmt]:
        """Append the workspace's coordinates in order, clearing what was touched."""
        ws = self.ws
        assert ws is not None
        last = self.layout.last
        c = ir.Var(self.count[last])
        if self.mode.counting:
            return ws.count_reached(c)

        def append(coord: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
            at = self._at(last)
            return [
                *self.levels[last].append_coord(c, coord, at),
                ir.Assign(ir.Load(self.vals, c), value),
                self._inc(last),
            ]

        room: list[ir.Stmt] = []
        if last in self.capacity:
            n = ir.Var(ws.length)
            room = self._bail(ir.Bin(">", ir.Bin("+", c, n), ir.Var(self.capacity[last])))
        return ws.gather(self.namer, append, room)

    def chunk_frame(self) -> ChunkFrame | None:
        """What `chunks.wrap` needs to run the single pass in chunks of rows."""
        if not self.mode.chunked:
            return None
        last = self.layout.last
        return ChunkFrame(
            row=self.var_names[self.vars[0]],
            rows=self._dim(0),
            chunks=self.chunks,
            sizes=self.sizes,
            levels=len(self.levels),
            last=last,
            pos=self.pos[last],
            arrays=(self.crd[last], self.vals),
            params=tuple(p.name for p in self.sig.params),
            namer=self.namer,
            carried=frozenset({self.count[last], *(self.ws.names() if self.ws else ())}),
        )
