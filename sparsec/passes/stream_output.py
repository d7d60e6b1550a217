"""A dense output's register tiles stored non-temporally when the output is at least the
last-level cache: the flag `STREAM_OUT`, decided once from the extents, and the template's
macro `STREAM_OUT_VALUES` it is compared with."""

from __future__ import annotations

from ..ir import nodes as ir
from ..ir.visit import map_blocks
from .bands import DEPTH
from .protocol import Passed, PassInput

#: the kernel's flag for storing output tiles non-temporally, and the template's macro for
#: the output size (in values) from which it is set
STREAM_OUT = "sc_stream_out"
STREAM_OUT_VALUES = ir.Var("SC_STREAM_OUT_VALUES")


def stream_output(p: Passed, unit: PassInput) -> Passed:
    """A dense output's register tiles stored non-temporally when the output is at least
    the last-level cache (it would be evicted before anything reads it again): the flag is
    decided once from the extents, and the kernel ends with a store fence. Unchanged when
    nothing was tiled or no tile stores into the output. A call in depth blocks (the kernel
    takes `DEPTH`) reads its output tiles back, so it never streams them."""
    spec, sig = unit.spec, unit.sig
    if not (p.of("tile") and spec.output.is_dense):
        return p
    size: ir.Expr = ir.IntLit(1)
    for index in spec.statement.lhs.indices:
        size = ir.mul(size, sig.extent(index))
    big: ir.Expr = ir.Bin(">=", size, STREAM_OUT_VALUES)
    if DEPTH in p.params:
        big = ir.conj(big, ir.Bin("==", ir.Var(DEPTH), ir.IntLit(0)))
    out = sig.array(spec.output.name, "vals")
    stored = ir.Block(tuple(_stores_out(s, out) for s in p.body.body))
    if stored == p.body:
        return p  # the tiles store elsewhere (a workspace), e.g. for a scalar output
    # a tile runs along the output's last level with stride 1 from a multiple of that
    # level's extent: when the array and that extent are whole vectors, every tile vector
    # is aligned, as a non-temporal store needs
    last = spec.statement.lhs.indices[spec.output.format.ordering[-1]]
    aligned = ir.Call("rows_aligned", (ir.Var(out), sig.extent(last)))
    flag = ir.Decl(ir.I64, STREAM_OUT, ir.conj(big, aligned))
    body = ir.block(flag, stored, ir.Effect(ir.Call("store_fence", ())))
    note = f"output tiles stored non-temporally from {unit.llc} bytes"
    return p.after("stream_output", body, (note,))


def _stores_out(s: ir.Stmt, out: str) -> ir.Stmt:
    """``s`` with each register tile's store into array ``out`` (the tile pass's
    ``vstore``) made an output store that may bypass the cache (``vstore_out``); tiles
    stored into a workspace, which is read again, keep the plain store."""
    if isinstance(s, ir.Effect) and s.call.fn == "vstore":
        at = s.call.args[0]
        if isinstance(at, ir.Bin) and at.op == "+" and at.left == ir.Var(out):
            return ir.Effect(ir.Call("vstore_out", (*s.call.args, ir.Var(STREAM_OUT))))
        return s
    return map_blocks(s, lambda b: ir.Block(tuple(_stores_out(x, out) for x in b.body)))
