"""The Gustavson workspace of a sparse output: a dense row over the output's last level
that the reductions scatter into, then gathered into the row in coordinate order.

The numeric kernel keeps values, a bitmap of the coordinates reached followed by its
summary (``top``: one bit per bitmap word), and the list of those reached. Counting needs
neither values nor the list: it marks bits and the span reached (``lo``..``hi``), then
counts the marked words through the summary. Each thread's bitmap and list are padded to
whole cache lines plus one, so threads never share a line, and the list has slack for the
branch-free appends of ``sc_mark`` and ``sc_sort_reached``.

A GPU kernel's workspace also holds a hash table per row (`Hash`), which the runtime
picks per launch (docs/cuda.md, "Hash tables per row").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..abi import OUT_OF_MEMORY, Namer
from ..ir import nodes as ir


@dataclass(frozen=True, slots=True)
class Hash:
    """A GPU workspace's other form, chosen by the runtime per launch (``mode``): a hash
    table per row (open addressing) at the row's offset ``off[row]`` into ``keys`` (and
    ``vals``), sized from a bound on the row's coordinates; mode 0 is the dense row,
    1 the hash table, 2 a tally of the scatters (counting only: the bound itself)."""

    mode: str
    off: str
    keys: str
    vals: str
    #: the row's locals: the mode, its table, the table's size and its count
    here: str
    row_keys: str
    row_vals: str
    cap: str
    count: str

    def is_(self, mode: int) -> ir.Expr:
        return ir.Bin("==", ir.Var(self.here), ir.IntLit(mode))


@dataclass(frozen=True, slots=True)
class Workspace:
    """The names of one kernel's workspace arrays (``""`` where the phase has none)."""

    var: str
    counting: bool
    #: the row's extent (the last level's dimension)
    size: ir.Expr
    w: str
    seen: str
    top: str
    reached: str
    length: str
    lo: str
    hi: str
    words: ir.Expr
    #: per-thread workspaces: the whole allocation behind each row-local name, and the
    #: stride of one thread's slice
    bases: tuple[tuple[str, str], ...]
    strides: tuple[tuple[str, ir.Expr], ...]
    #: what the kernel frees (and frees before leaving early)
    allocated: tuple[str, ...]
    #: a GPU kernel's per-row hash tables, the runtime's alternative to the dense row
    hash: Hash | None = None

    @property
    def _types(self) -> dict[str, str]:
        return {self.w: ir.VAL, self.seen: ir.U64, self.reached: ir.I64}

    def row_state(self) -> list[ir.Stmt]:
        """The summary behind the bitmap, and the row's list length or span."""
        stmts: list[ir.Stmt] = [ir.Pointer(ir.U64, self.top, self.seen, self.words)]
        if self.counting:
            stmts += [ir.Decl(ir.I64, self.lo, self.size), ir.Decl(ir.I64, self.hi, ir.IntLit(-1))]
        else:
            stmts.append(ir.Decl(ir.I64, self.length, ir.IntLit(0)))
        return stmts

    def row_slices(self, row: ir.Expr) -> list[ir.Stmt]:
        """In a row (position ``row``) of a parallel loop: this thread's slice of each
        workspace array; on a GPU also the row's hash table (`Hash`)."""
        if not self.bases:
            return []
        tid = ir.Call("thread_id", ())
        stride = dict(self.strides)
        stmts: list[ir.Stmt] = [
            ir.Pointer(self._types[name], name, base, ir.mul(tid, stride[name]))
            for name, base in self.bases
        ]
        h = self.hash
        if h is not None:
            start = ir.Load(h.off, row)
            stmts += [
                ir.Decl(ir.I64, h.here, ir.Load(h.mode, ir.IntLit(0))),
                ir.Decl(
                    ir.I64, h.cap, ir.Bin("-", ir.Load(h.off, ir.add(row, ir.IntLit(1))), start)
                ),
                ir.Pointer(ir.I64, h.row_keys, h.keys, start),
                ir.Decl(ir.I64, h.count, ir.IntLit(0)),
            ]
            if not self.counting:
                stmts.append(ir.Pointer(ir.VAL, h.row_vals, h.vals, start))
        return stmts + self.row_state()

    def names(self) -> frozenset[str]:
        """Every name the workspace declares (a kernel's own, not shared with its callers)."""
        named = (self.w, self.seen, self.top, self.reached, self.length, self.lo, self.hi)
        return frozenset(n for n in (*named, *self.allocated) if n)

    def free(self) -> list[ir.Stmt]:
        return [ir.Free(n) for n in self.allocated]

    def scatter(self, coord: ir.Expr, value: ir.Expr | None) -> list[ir.Stmt]:
        """``w[j] += value``, remembering ``j`` the first time it is reached.

        The numeric phase appends to the list without a branch (``sc_mark``); counting only
        sets the bits (no test, no branch) and widens the span reached."""
        seen, top = ir.Var(self.seen), ir.Var(self.top)
        h = self.hash
        if self.counting:
            lo, hi = ir.Var(self.lo), ir.Var(self.hi)
            dense: list[ir.Stmt] = [
                ir.Effect(ir.Call("mark_bits", (seen, top, coord))),
                ir.Assign(lo, ir.Call("min", (lo, coord))),
                ir.Assign(hi, ir.Call("max", (hi, coord))),
            ]
            if h is None:
                return dense
            c = ir.Var(h.count)
            added = ir.Call("hash_add_key", (ir.Var(h.row_keys), ir.Var(h.cap), coord))
            return [
                ir.If(
                    (
                        (h.is_(0), ir.block(*dense)),
                        (h.is_(1), ir.block(ir.Assign(c, ir.Bin("+", c, added)))),
                    ),
                    ir.block(ir.Assign(c, ir.Bin("+", c, ir.IntLit(1)))),  # the tally
                )
            ]
        n = ir.Var(self.length)
        stmts: list[ir.Stmt] = [
            ir.Assign(n, ir.Call("mark", (seen, top, ir.Var(self.reached), n, coord)))
        ]
        if value is not None:
            stmts.append(ir.Assign(ir.Load(self.w, coord), value, "+="))
        if h is None:
            return stmts
        slot = ir.Call("hash_slot", (ir.Var(h.row_keys), ir.Var(h.cap), coord))
        hashed: list[ir.Stmt] = [ir.Effect(slot)]
        if value is not None:
            hashed = [ir.Assign(ir.Load(h.row_vals, slot), value, "+=")]
        return [ir.If(((h.is_(1), ir.block(*hashed)),), ir.block(*stmts))]

    def count_reached(self, count: ir.Var) -> list[ir.Stmt]:
        """Counting: add the coordinates reached to ``count`` and clear them
        (``sc_count_reached`` clears the bitmap and its summary as it counts)."""
        seen, top = ir.Var(self.seen), ir.Var(self.top)
        lo, hi = ir.Var(self.lo), ir.Var(self.hi)
        reached = ir.Call("count_reached", (seen, top, lo, hi))
        dense: list[ir.Stmt] = [
            ir.Assign(count, ir.Bin("+", count, reached)),
            ir.Assign(lo, self.size),
            ir.Assign(hi, ir.IntLit(-1)),
        ]
        h = self.hash
        if h is None:
            return dense
        # a hash table or a tally: the row's count so far (a row's table is used once)
        c = ir.Var(h.count)
        taken = ir.block(ir.Assign(count, ir.Bin("+", count, c)), ir.Assign(c, ir.IntLit(0)))
        return [ir.If(((h.is_(0), ir.block(*dense)),), taken)]

    def gather(
        self,
        namer: Namer,
        append: Callable[[ir.Expr, ir.Expr], list[ir.Stmt]],
        room: list[ir.Stmt],
    ) -> list[ir.Stmt]:
        """Visit the coordinates reached in order (``sc_sort_reached`` orders the list and
        clears the bitmap and its summary as it goes): ``append(j, w[j])`` stores the
        entry, then ``w[j]`` is cleared. ``room`` checks the capacity for the row first."""
        n = ir.Var(self.length)
        t = namer.fresh("q")
        j = ir.Var(namer.fresh("j_w"))
        body = ir.block(
            ir.Decl(ir.I64, j.name, ir.Load(self.reached, ir.Var(t))),
            *append(j, ir.Load(self.w, j)),
            ir.Assign(ir.Load(self.w, j), ir.FloatLit(0.0)),
        )
        reached = (ir.Var(self.reached), n, ir.Var(self.seen), ir.Var(self.top))
        dense: list[ir.Stmt] = [
            *room,
            ir.Effect(ir.Call("sort_reached", reached)),
            ir.For(t, ir.IntLit(0), n, body),
            ir.Assign(n, ir.IntLit(0)),
        ]
        h = self.hash
        if h is None:
            return dense
        # the table's entries moved to its front and sorted by coordinate, then appended
        keys, vals, m = ir.Var(h.row_keys), ir.Var(h.row_vals), ir.Var(h.count)
        q = namer.fresh("q")
        entry = ir.block(*append(ir.Load(h.row_keys, ir.Var(q)), ir.Load(h.row_vals, ir.Var(q))))
        hashed = ir.block(
            ir.Assign(m, ir.Call("hash_sort", (keys, vals, ir.Var(h.cap)))),
            ir.For(q, ir.IntLit(0), m, entry),
        )
        return [ir.If(((h.is_(1), hashed),), ir.block(*dense))]


def allocate(
    var: str,
    size: ir.Expr,
    namer: Namer,
    counting: bool,
    copies: ir.Expr | None,
    given: dict[str, str] | None = None,
) -> tuple[Workspace, list[ir.Stmt]]:
    """A workspace over ``var`` (extent ``size``) and the statements allocating it;
    ``copies``: one per thread (each row takes its thread's slice, `row_slices`);
    ``given``: the parameters holding the slices by role ("vals", "seen", "list"),
    allocated (zeroed) by the runtime (a GPU kernel), so nothing is allocated here."""
    w = namer.fresh("w")
    seen = namer.fresh("w_seen")
    top = namer.fresh("w_top")
    lo = hi = lst = length = ""
    if counting:
        lo, hi = namer.fresh("w_lo"), namer.fresh("w_hi")
    else:
        lst, length = namer.fresh("w_list"), namer.fresh("w_len")
    words = ir.Bin("/", ir.Bin("+", size, ir.IntLit(63)), ir.IntLit(64))
    tops = ir.Bin("/", ir.Bin("+", size, ir.IntLit(4095)), ir.IntLit(4096))
    strides = {seen: _lines(ir.Bin("+", words, tops))}
    if not counting:
        strides = {w: size, **strides, lst: _lines(size)}
    bases = {n: namer.fresh(f"{n}_all") for n in strides} if copies is not None else {}
    if given is not None:
        roles = {w: "vals", seen: "seen", lst: "list"}
        bases = {n: given[roles[n]] for n in strides}
    allocated = tuple(bases[n] if bases else n for n in strides) if given is None else ()
    ws = Workspace(
        var,
        counting,
        size,
        w,
        seen,
        top,
        lst,
        length,
        lo,
        hi,
        words,
        tuple(bases.items()),
        tuple(strides.items()),
        allocated,
    )
    stmts: list[ir.Stmt] = [ir.Comment(f"workspace: a dense row over {var} (Gustavson)")]
    if given is not None:
        names = [namer.fresh(n) for n in ("w_mode", "w_cap", "w_keys", "w_hvals", "w_count")]
        here, cap, row_keys, row_vals, count = names
        table = Hash(
            given["mode"],
            given["off"],
            given["keys"],
            given["hvals"],
            here,
            row_keys,
            row_vals,
            cap,
            count,
        )
        stmts[0] = ir.Comment(f"workspace: a dense row over {var} or a hash table per row")
        return replace(ws, hash=table), stmts
    each = copies if copies is not None else ir.IntLit(1)
    for name, array in zip(strides, allocated, strict=True):
        stmts.append(ir.Alloc(ws._types[name], array, ir.mul(each, strides[name])))
    failed: ir.Expr = ir.Unary("!", ir.Var(allocated[0]))
    for name in allocated[1:]:
        failed = ir.Bin("||", failed, ir.Unary("!", ir.Var(name)))
    stmts.append(ir.Return(OUT_OF_MEMORY, failed))
    if copies is None:
        stmts += ws.row_state()
    return ws, stmts


def _lines(count: ir.Expr) -> ir.Expr:
    """``count`` 8-byte elements rounded up to whole 64-byte lines, plus one line of slack."""
    return ir.mul(ir.Bin("/", ir.Bin("+", count, ir.IntLit(15)), ir.IntLit(8)), ir.IntLit(8))
