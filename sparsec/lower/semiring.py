"""A kernel's values under a semiring other than ``plus_times`` (GraphBLAS's model).

The lattices, loops and stores are those of ``plus_times`` (``*`` intersects, ``+``
unites, in every semiring here): only values change. `combine` builds a case's ``*`` and
``+`` with the semiring's multiply and add (the lowerer's ``_value``); `apply` rewrites
the finished loop IR of one kernel, so every accumulation the lowering and its helpers
emit (scalar accumulators, scalar temporaries of nested sums, dense outputs, workspaces,
threads' private copies, runs of a segment) follows the semiring without each knowing
it:

* every accumulating update ``x += v`` becomes the add's update (``min=``, ``max=``,
  ``or=``; the printer spells them: an atomic one as a critical section on the C target,
  a compare-and-swap loop on CUDA);
* every accumulator's start, a value location declared or reset to ``0.0``, starts at
  the add's identity instead, and every zeroed value array (``calloc``) is filled with it
  (unless the identity is 0);
* a serial loop that only ors into one local stops once it is true, and one that only
  takes any value into one local once it holds one (`_stop_once_done`);
* an OpenMP ``reduction(+:...)`` loop runs on one thread where the add is not ``+``
  (OpenMP's ``min`` reduction starts each thread from the type's largest finite value,
  not from ``inf``).

A warp's shuffle reduction (``warp_sum``, `output.store_shared`) becomes the add's
(``warp_min``, ``warp_max``, ``warp_or``: the CUDA template's shuffle loops). The pipeline
runs no passes on a semiring kernel (their register tiles, bands and coarsened threads
add with ``+``).
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.semirings import Semiring
from ..ir import nodes as ir
from ..ir.visit import map_blocks

#: the add's accumulating update, as an `ir.Assign` op
UPDATES = {"+": "+=", "min": "min=", "max": "max=", "or": "or=", "any": "min="}
#: an add computed as another (its helper, its shuffle reductions ``warp_*``, ``group_*``):
#: any value of the terms is an answer of ``any``, the least among them too
COMPUTED_AS = {"any": "min"}
_VALUE_TYPES = (ir.VAL, ir.ACC)


def combine(ring: Semiring, op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """``a op b`` for a case's ``*`` or ``+`` under ``ring``."""
    kind = ring.multiply if op == "*" else ring.add
    match kind:
        case "+" | "*":
            return ir.Bin(kind, a, b)
        case "min" | "max" | "any":
            # a helper of the templates: each operand evaluated (and printed) once
            return ir.Call(f"v{COMPUTED_AS.get(kind, kind)}", (a, b))
        case "or":
            return ir.Bin("||", a, b)
        case "and":
            return ir.Bin("&&", a, b)
        case "pair" | "second":
            # the templates' sc_pair (1) and sc_second (b): both operands stay in the IR,
            # so a guarded operand's presence is carried up (`union._hoist`)
            return ir.Call(kind, (a, b))
        case _:
            raise AssertionError(f"unknown semiring operator {kind}")


def truth(ring: Semiring, value: ir.Expr) -> ir.Expr:
    """A value read from a tensor: under a boolean semiring, 1 or 0 (nonzero is true)."""
    return ir.Bin("!=", value, ir.FloatLit(0.0)) if ring.boolean else value


def apply(ring: Semiring, body: ir.Block) -> ir.Block:
    """``body`` (one kernel, plus_times shaped) computing under ``ring``."""
    if ring.is_default:
        return body
    return _Rewrite(ring).block(body)


class _Rewrite:
    """One kernel's statements rewritten for ``ring`` (see the module's list)."""

    def __init__(self, ring: Semiring) -> None:
        self.ring = ring
        self.identity = ir.FloatLit(ring.identity)
        self.update = UPDATES[ring.add]
        self.shuffle = COMPUTED_AS.get(ring.add, ring.add)

    def block(self, b: ir.Block) -> ir.Block:
        out: list[ir.Stmt] = []
        for s in b.body:
            out.extend(self.stmt(s))
        return ir.Block(tuple(out))

    def stmt(self, s: ir.Stmt) -> list[ir.Stmt]:
        match s:
            case ir.Assign(value=ir.Call(fn="warp_sum", args=args)):
                # a warp's lanes combine with the add (the templates' shuffle loops)
                return [replace(s, value=ir.Call(f"warp_{self.shuffle}", args))]
            case ir.Assign(value=ir.Call(fn="group_sum", args=args)):
                return [replace(s, value=ir.Call(f"group_{self.shuffle}", args))]
            case ir.Decl(type=ty, init=ir.FloatLit(value=0.0)) if ty in _VALUE_TYPES:
                return [replace(s, init=self.identity)]
            case ir.Assign(value=ir.FloatLit(value=0.0), op="="):
                return [replace(s, value=self.identity)]
            case ir.Assign(op="+="):
                return [replace(s, op=self.update)]
            case ir.Alloc(type=ty, name=name, count=count) if ty in _VALUE_TYPES:
                if self.ring.identity == 0.0:
                    return [s]  # calloc's zeros are the identity already
                return [s, self._fill(name, count)]
            case ir.For(parallel=None) if self.ring.add in ("or", "any"):
                done = None if self.ring.add == "or" else self.identity
                return [_stop_once_done(replace(s, body=self.block(s.body)), self.update, done)]
            case ir.For(parallel=par) if par is not None and par.reduction and self.update != "+=":
                # OpenMP's min/max reductions start from the largest finite value, not inf
                # (an add that is + keeps OpenMP's reduction: plus_pair)
                return [replace(s, parallel=None, body=self.block(s.body))]
            case _:
                return [map_blocks(s, self.block)]

    def _fill(self, name: str, count: ir.Expr) -> ir.Stmt:
        """Fill a freshly zeroed value array with the add's identity, where it was allocated:
        the allocation's failure is checked after it (`Alloc` returns the status then), so
        the fill must not write through a NULL before that."""
        q = f"{name}_q"
        fill = ir.For(
            q, ir.IntLit(0), count, ir.block(ir.Assign(ir.Load(name, ir.Var(q)), self.identity))
        )
        return ir.If(((ir.Var(name), ir.block(fill)),))


def _stop_once_done(loop: ir.For, update: str, done: ir.Expr | None) -> ir.For:
    """A serial loop whose only effect is ``acc <update> ...`` into one local ``acc``
    stops once the add can take no other value (its terminal, as GraphBLAS's terminal
    monoids): ``or`` once ``acc`` is true (``done`` None), ``any`` once ``acc`` differs from
    the identity ``done`` (any value is the answer). Its bound reads ``stopped ? var :
    end``, so the test fails at the next iteration. A pull BFS step then scans a row only
    up to its first frontier neighbour (levels under or, parents under any)."""
    found = _only_update_into(loop.body, update)
    if not found:
        return loop
    acc = ir.Var(found)
    stopped = acc if done is None else ir.Bin("!=", acc, done)
    return replace(loop, end=ir.Select(stopped, ir.Var(loop.var), loop.end))


def _only_update_into(body: ir.Block, op: str) -> str | None:
    """The one local every ``op`` update of ``body`` (``or=``, ``min=``) updates, where
    that is all ``body`` does besides declaring locals and branching; None otherwise."""
    targets: set[str] = set()
    for s in body.body:
        match s:
            case ir.Decl() | ir.Comment():
                continue
            case ir.Assign(target=ir.Var(name=name), op=update, atomic=False) if update == op:
                targets.add(name)
            case ir.Assign(target=ir.Var(), op="=", value=ir.IntLit(value=1)):
                continue  # a "reached" flag: already set when the loop stops
            case ir.If(branches=branches, orelse=orelse):
                blocks = [b for _, b in branches] + ([orelse] if orelse is not None else [])
                for b in blocks:
                    inner = _only_update_into(b, op)
                    if inner is None and b.body:
                        return None
                    targets |= {inner} if inner else set()
            case _:
                return None
    return targets.pop() if len(targets) == 1 else None
