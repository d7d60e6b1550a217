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

from typing import TYPE_CHECKING

from ..abi import CAPACITY_EXCEEDED, OUT_OF_MEMORY
from ..frontend.notation import Access
from ..ir import nodes as ir
from ..middle.order import level_indices
from ..tensors.layout import OutputLayout

if TYPE_CHECKING:  # the lowerer owns an Assembler; only the type is needed here
    from .lowerer import Lowerer

#: blocks of spare ``vals`` the runtime allocates past an output's last block (see
#: `Assembler.around`)
BLOCK_SLACK = 1
#: extents of the last output level allocated beyond its entry bound (see
#: `Assembler.precheck`)
LAST_LEVEL_SLACK = 1


class Assembler:
    """Generates the output-assembly statements for one kernel (count or compute mode)."""

    def __init__(self, lowerer: Lowerer, counting: bool, append: bool = False) -> None:
        self.low = lowerer
        self.counting = counting
        self.lhs: Access = lowerer.lhs
        out = lowerer.spec.output
        self.name = out.name
        self.layout = OutputLayout.of(out.format, out.name)
        self.vars = level_indices(self.lhs, out.format)
        namer, sig = lowerer.namer, lowerer.sig
        appended = (*self.layout.inner, self.layout.last)
        #: position counter per appended level (the next free position)
        self.count = {k: namer.fresh(f"p{self.name}{k + 1}") for k in appended}
        self.pos = {k: sig.array(self.name, "pos", k) for k in appended}
        self.crd = {k: sig.array(self.name, "crd", k) for k in (*appended, *self.layout.tail)}
        self.vals = sig.array(self.name, "vals")
        self.sizes = sig.sizes
        self.touched = namer.fresh("stored") if self.layout.block else ""
        #: the single-pass kernel: its last level has slack, so loops check up front
        self.append = append
        #: inside a loop whose appends were checked up front (`precheck`)
        self.checked = False
        #: appending kernels: each appended level's capacity, read from ``sc_sizes``
        self.capacity = (
            {}
            if counting or (self.layout.rowwise and not append)
            else {k: namer.fresh(f"cap{self.name}{k + 1}") for k in appended}
        )
        #: rows are independent: per-row counters, ``pos`` prefix-summed by the runtime
        #: (``append``: one counter across rows instead, for the single-pass kernel)
        self.rowwise = self.layout.rowwise and not append
        # the workspace (set by `workspace_alloc` when the lowering needs one)
        self.workspace_var = ""
        self.w = self.seen = self.top = self.list = self.length = self.lo = self.hi = ""
        self.words: ir.Expr = ir.IntLit(0)
        #: per-thread workspaces: the whole allocation behind each row-local name
        self.bases: dict[str, str] = {}
        self.sizes_of: dict[str, ir.Expr] = {}
        self.allocated: list[str] = []

    # --------------------------------------------------------------- helpers
    def _store(self, array: str, index: ir.Expr, value: ir.Expr) -> list[ir.Stmt]:
        return [] if self.counting else [ir.Assign(ir.Load(array, index), value)]

    def _room(self, k: int, slack: bool = False) -> list[ir.Stmt]:
        """Leave the kernel before appending past level ``k``'s capacity (``slack``: the
        position one past it may still be written: a dense block's spare, see `BLOCK_SLACK`)."""
        if k not in self.capacity:
            return []
        full = ir.Bin(">" if slack else ">=", ir.Var(self.count[k]), ir.Var(self.capacity[k]))
        return self._bail(full)

    def precheck(self, var: str, room: ir.Expr) -> list[ir.Stmt]:
        """Before a loop that binds the output's last level and appends at most ``room``
        entries (one per iteration): a single capacity check for the whole loop, after
        which its stores skip their own (`checked`). A check per append costs a merge
        about a tenth of its time. Empty when the level's entries are not appended one
        per iteration (COO's singletons, dense blocks) or are gathered from a workspace.

        The loop appends at most ``min(room, extent)`` distinct coordinates. The runtime
        gives the last level `LAST_LEVEL_SLACK` extents beyond its bound, so a correct
        bound never fails this check, however loosely ``room`` counts."""
        layout = self.layout
        if (
            not self.append
            or self.level_of(var) != layout.last
            or layout.last not in self.capacity
            or not layout.one_entry_per_step
            or self.low.workspace is not None
        ):
            return []
        c = ir.Var(self.count[layout.last])
        most = ir.Call("min", (room, self._dim(layout.last)))
        return self._bail(ir.Bin(">", ir.Bin("+", c, most), ir.Var(self.capacity[layout.last])))

    def _bail(self, cond: ir.Expr) -> list[ir.Stmt]:
        """Leave with CAPACITY_EXCEEDED when ``cond`` holds, freeing the workspace."""
        frees = [ir.Free(name) for name in self.allocated]
        return [ir.If(((cond, ir.block(*frees, ir.Return(CAPACITY_EXCEEDED, ir.IntLit(1)))),))]

    def _inc(self, k: int) -> ir.Stmt:
        c = ir.Var(self.count[k])
        return ir.Assign(c, ir.Bin("+", c, ir.IntLit(1)))

    def _coord(self, k: int) -> ir.Expr:
        return ir.Var(self.low.var_names[self.vars[k]])

    def _dim(self, k: int) -> ir.Expr:
        return ir.Var(self.low.sig.dim(self.vars[k]))

    def _prefix_positions(self) -> ir.Expr:
        """Positions of the dense prefix: the parents of the first sparse level."""
        size: ir.Expr = ir.IntLit(1)
        for k in range(self.layout.dense_prefix):
            size = ir.mul(size, self._dim(k))
        return size

    def _block_size(self) -> ir.Expr:
        size: ir.Expr = ir.IntLit(1)
        for k in self.layout.block:
            size = ir.mul(size, self._dim(k))
        return size

    # -------------------------------------------------------------- kernel
    def prologue(self) -> list[ir.Stmt]:
        if self.rowwise:
            return []  # counters live in each row; pos comes prefix-summed from the runtime
        stmts: list[ir.Stmt] = [ir.Decl(ir.I64, c, ir.IntLit(0)) for c in self.count.values()]
        first = min(self.count)
        if self.counting:
            return stmts
        for k, cap in self.capacity.items():
            stmts.append(ir.Decl(ir.I64, cap, ir.Load(self.sizes, ir.IntLit(k))))
        if first == 0:
            stmts += self._store(self.pos[0], ir.IntLit(0), ir.IntLit(0))
        else:
            p = self.low.namer.fresh("p")
            zero = ir.Assign(ir.Load(self.pos[first], ir.Var(p)), ir.IntLit(0))
            end = ir.Bin("+", self._prefix_positions(), ir.IntLit(1))
            stmts.append(ir.For(p, ir.IntLit(0), end, ir.block(zero)))
        for k in self.count:
            if k != first:
                stmts += self._store(self.pos[k], ir.IntLit(0), ir.IntLit(0))
        return stmts

    def epilogue(self) -> list[ir.Stmt]:
        if self.rowwise:
            return []
        first = min(self.count)
        if self.counting:
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
            return self._store(self.pos[0], ir.IntLit(1), ir.Var(self.count[0]))
        # parents never visited keep the count of the parent before them (prefix max)
        p = self.low.namer.fresh("p")
        pos = self.pos[first]
        here, before = ir.Load(pos, ir.Var(p)), ir.Load(pos, ir.Bin("-", ir.Var(p), ir.IntLit(1)))
        fix = ir.If(((ir.Bin("<", here, before), ir.block(ir.Assign(here, before))),))
        end = ir.Bin("+", self._prefix_positions(), ir.IntLit(1))
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
        if k == layout.dense_prefix - 1 and ctx_pos is not None and self.rowwise:
            # one row: count its entries into pos[p + 1], or fill them from pos[p]
            row_count = self.count[layout.last]
            row_pos = self.pos[layout.last]
            row_start = ir.IntLit(0) if self.counting else ir.Load(row_pos, ctx_pos)
            before.append(ir.Decl(ir.I64, row_count, row_start))
            before += self._row_workspace()
            if self.counting:
                end = ir.Load(row_pos, ir.Bin("+", ctx_pos, ir.IntLit(1)))
                after.append(ir.Assign(end, ir.Var(row_count)))
        elif k == layout.dense_prefix - 1 and ctx_pos is not None:
            # the dense parent of the first sparse level: record where its children end
            child = min(self.count)
            after += self._store(
                self.pos[child], ir.Bin("+", ctx_pos, ir.IntLit(1)), ir.Var(self.count[child])
            )
        elif k in layout.inner:
            child = min(j for j in self.count if j > k)
            start = self.low.namer.fresh(f"{self.count[child]}_start")
            before.append(ir.Decl(ir.I64, start, ir.Var(self.count[child])))
            body = self._room(k) + self._store(self.crd[k], ir.Var(self.count[k]), self._coord(k))
            body.append(self._inc(k))
            body += self._store(self.pos[child], ir.Var(self.count[k]), ir.Var(self.count[child]))
            cond = ir.Bin(">", ir.Var(self.count[child]), ir.Var(start))
            after.append(ir.If(((cond, ir.block(*body)),)))
        elif k == layout.last and layout.block:
            c = ir.Var(self.count[k])
            before.append(ir.Decl(ir.BOOL, self.touched, ir.IntLit(0)))
            if not self.counting:
                # the block at the next free position is zeroed before anything is known to
                # be stored in it, so vals has one spare block past the last kept entry
                before += self._room(k, slack=True)
                p = self.low.namer.fresh("p")
                size = self._block_size()
                at = ir.add(ir.mul(c, size), ir.Var(p))
                zero = ir.Assign(ir.Load(self.vals, at), ir.FloatLit(0.0))
                before.append(ir.For(p, ir.IntLit(0), size, ir.block(zero)))
            body = self._room(k) + self._store(self.crd[k], c, self._coord(k))
            body.append(self._inc(k))
            after.append(ir.If(((ir.Var(self.touched), ir.block(*body)),)))
        return before, after

    # --------------------------------------------------------------- store
    def store(self, slot: ir.Load, value: ir.Expr | None) -> list[ir.Stmt]:
        """One output entry at the innermost level (``value`` is None when counting)."""
        layout = self.layout
        if layout.block:
            stmts: list[ir.Stmt] = [ir.Assign(ir.Var(self.touched), ir.IntLit(1))]
            if value is not None and not self.counting:
                stmts.append(ir.Assign(slot, value, "+="))
            return stmts
        c = ir.Var(self.count[layout.last])
        stmts = [] if self.counting or self.checked else self._room(layout.last)
        for k in (layout.last, *layout.tail):
            stmts += self._store(self.crd[k], c, self._coord(k))
        if value is not None:
            stmts += self._store(self.vals, c, value)
        stmts.append(self._inc(layout.last))
        return stmts

    # ------------------------------------------------------------ workspace
    def can_scatter(self) -> bool:
        """A unique compressed last level with nothing below it can go through a workspace."""
        layout = self.layout
        return layout.fmt.levels[layout.last].unique and not layout.block and not layout.tail

    def workspace_alloc(self, var: str | None) -> list[ir.Stmt]:
        """A dense row over ``var``: values, a bitmap of the coordinates reached followed by
        its summary (``top``: one bit per bitmap word), and the list of those reached.

        Counting needs neither values nor the list: it marks bits and the span reached
        (``lo``..``hi``), then counts the marked words through the summary. Each thread's
        bitmap and list are padded to whole cache lines plus one, so threads never share a
        line, and the list has slack for the branch-free appends of ``sc_mark`` and
        ``sc_sort_reached``."""
        if var is None:
            return []
        namer = self.low.namer
        self.workspace_var = var
        self.w = namer.fresh("w")
        self.seen = namer.fresh("w_seen")
        self.top = namer.fresh("w_top")
        if self.counting:
            self.lo, self.hi = namer.fresh("w_lo"), namer.fresh("w_hi")
        else:
            self.list, self.length = namer.fresh("w_list"), namer.fresh("w_len")
        size = ir.Var(self.low.sig.dim(var))
        self.words = ir.Bin("/", ir.Bin("+", size, ir.IntLit(63)), ir.IntLit(64))
        tops = ir.Bin("/", ir.Bin("+", size, ir.IntLit(4095)), ir.IntLit(4096))
        strides = {self.seen: _lines(ir.Bin("+", self.words, tops))}
        if not self.counting:
            strides = {self.w: size, **strides, self.list: _lines(size)}
        copies: ir.Expr = ir.IntLit(1)
        if self.rowwise:
            # one workspace per thread; each row takes its thread's slice (`_row_workspace`)
            copies = ir.Var(self.low.sig.threads)
            self.bases = {n: namer.fresh(f"{n}_all") for n in strides}
            self.sizes_of = strides
        stmts: list[ir.Stmt] = [ir.Comment(f"workspace: a dense row over {var} (Gustavson)")]
        self.allocated = [self.bases[n] if self.rowwise else n for n in strides]
        for name, array in zip(strides, self.allocated, strict=True):
            stmts.append(ir.Alloc(self._types[name], array, ir.mul(copies, strides[name])))
        failed: ir.Expr = ir.Unary("!", ir.Var(self.allocated[0]))
        for name in self.allocated[1:]:
            failed = ir.Bin("||", failed, ir.Unary("!", ir.Var(name)))
        stmts.append(ir.Return(OUT_OF_MEMORY, failed))
        if not self.rowwise:
            stmts += self._row_state()
        return stmts

    @property
    def _types(self) -> dict[str, str]:
        return {self.w: ir.VAL, self.seen: ir.U64, self.list: ir.I64}

    def _row_state(self) -> list[ir.Stmt]:
        """The summary behind the bitmap, and the row's list length or span."""
        stmts: list[ir.Stmt] = [ir.Pointer(ir.U64, self.top, self.seen, self.words)]
        if self.counting:
            size = ir.Var(self.low.sig.dim(self.workspace_var))
            stmts += [
                ir.Decl(ir.I64, self.lo, size),
                ir.Decl(ir.I64, self.hi, ir.IntLit(-1)),
            ]
        else:
            stmts.append(ir.Decl(ir.I64, self.length, ir.IntLit(0)))
        return stmts

    def workspace_free(self, var: str | None) -> list[ir.Stmt]:
        if var is None:
            return []
        return [ir.Free(n) for n in self.allocated]

    def _row_workspace(self) -> list[ir.Stmt]:
        """In a row of a parallel loop: this thread's slice of each workspace array."""
        if not self.bases:
            return []
        tid = ir.Call("thread_id", ())
        stmts: list[ir.Stmt] = []
        for name, base in self.bases.items():
            stmts.append(
                ir.Pointer(self._types[name], name, base, ir.mul(tid, self.sizes_of[name]))
            )
        return stmts + self._row_state()

    def scatter(self, coord: ir.Expr, value: ir.Expr | None) -> list[ir.Stmt]:
        """``w[j] += value``, remembering ``j`` the first time it is reached.

        The numeric phase appends to the list without a branch (``sc_mark``); counting only
        sets the bits (no test, no branch) and widens the span reached."""
        seen, top = ir.Var(self.seen), ir.Var(self.top)
        if self.counting:
            lo, hi = ir.Var(self.lo), ir.Var(self.hi)
            return [
                ir.Effect(ir.Call("mark_bits", (seen, top, coord))),
                ir.Assign(lo, ir.Call("min", (lo, coord))),
                ir.Assign(hi, ir.Call("max", (hi, coord))),
            ]
        n = ir.Var(self.length)
        stmts: list[ir.Stmt] = [
            ir.Assign(n, ir.Call("mark", (seen, top, ir.Var(self.list), n, coord)))
        ]
        if value is not None:
            stmts.append(ir.Assign(ir.Load(self.w, coord), value, "+="))
        return stmts

    def gather(self) -> list[ir.Stmt]:
        """Append the workspace's coordinates in order, clearing what was touched
        (``sc_sort_reached`` clears the bitmap and its summary as it orders the list;
        ``sc_count_reached`` as it counts)."""
        last = self.layout.last
        c = ir.Var(self.count[last])
        seen, top = ir.Var(self.seen), ir.Var(self.top)
        if self.counting:
            lo, hi = ir.Var(self.lo), ir.Var(self.hi)
            reached = ir.Call("count_reached", (seen, top, lo, hi))
            return [
                ir.Assign(c, ir.Bin("+", c, reached)),
                ir.Assign(lo, ir.Var(self.low.sig.dim(self.workspace_var))),
                ir.Assign(hi, ir.IntLit(-1)),
            ]
        n = ir.Var(self.length)
        t = self.low.namer.fresh("q")
        j = self.low.namer.fresh("j_w")
        body = ir.block(
            ir.Decl(ir.I64, j, ir.Load(self.list, ir.Var(t))),
            ir.Assign(ir.Load(self.crd[last], c), ir.Var(j)),
            ir.Assign(ir.Load(self.vals, c), ir.Load(self.w, ir.Var(j))),
            self._inc(last),
            ir.Assign(ir.Load(self.w, ir.Var(j)), ir.FloatLit(0.0)),
        )
        room: list[ir.Stmt] = []
        if last in self.capacity:
            room = self._bail(ir.Bin(">", ir.Bin("+", c, n), ir.Var(self.capacity[last])))
        return [
            *room,
            ir.Effect(ir.Call("sort_reached", (ir.Var(self.list), n, seen, top))),
            ir.For(t, ir.IntLit(0), n, body),
            ir.Assign(n, ir.IntLit(0)),
        ]


def _lines(count: ir.Expr) -> ir.Expr:
    """``count`` 8-byte elements rounded up to whole 64-byte lines, plus one line of slack."""
    return ir.mul(ir.Bin("/", ir.Bin("+", count, ir.IntLit(15)), ir.IntLit(8)), ir.IntLit(8))
