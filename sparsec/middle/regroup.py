"""Regrouping dense factors: ``A(i,j) * p(j) / g(j)`` reads ``A(i,j) * T(j)``, ``T = p / g``.

A product (or quotient) chain multiplies every stored entry of its sparse factor by each
dense factor in turn. When two or more dense factors range over the same variables ``S``,
fewer than the sparse factor's, their combination does not depend on the sparse factor's
other variables: it is computed once per point of ``S`` at call time (a `Folded` input,
O(|S|), in the kernel's dtype) and the kernel reads one factor instead of several. For
PageRank's ``p2(i) = A(i,j) * p(j) / g(j)`` this takes the division out of the loop over
A's entries, as scipy's ``A @ (p / g)`` does.

The value changes only by rounding: the product is reassociated, as ``A @ (p / g)``
against ``(A * p) / g`` (so ``(A*p)/g`` that overflows to inf may come out finite), and a
zero, inf or NaN among the factors gives the same inf or NaN in any order. Presence is
unchanged: dense factors are present everywhere, under ``division="sparse"`` a quotient
is present where its numerator is, and so is the regrouped one. It is not done

- under ``division="ieee"`` (``0/0`` at an absent entry must stay NaN) or a semiring other
  than plus-times (docs/semantics.md);
- under a user schedule (its commands may name the factors);
- when a sum would not stay where it was: only statements whose sums all enclose the
  whole right-hand side, before and after (``(Σj A*p) / g * h`` keeps its nested sum);
- across the right side of a ``/`` (``x / (y / z)`` is present where ``x`` is, not ``z``);
- for a mask, a derived input, a scalar, or a group without a sparse factor over more
  variables (a dense ``|S|`` computation would then cost as much as it saves).
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend.concrete import CExpr, Sum, children, concretize
from ..frontend.notation import Access, BinOp, Call, Expr, Neg, accesses
from ..tensors.formats import Format
from .spec import Factor, Folded, Spec, TensorVar

#: (factor, divides) of one chain, left to right
Chain = list[tuple[Expr, bool]]


def regroup(spec: Spec) -> Spec:
    """``spec`` with each chain's dense factors over a common set of fewer variables than
    a sparse factor's read as one `Folded` input; ``spec`` itself when none qualifies."""
    semantics = spec.semantics
    if semantics.division != "sparse" or semantics.semiring != "plus_times":
        return spec
    if _nested_sums(spec.statement.rhs):
        return spec
    folds: list[Folded] = []
    rhs = _walk(spec, spec.assignment.rhs, folds)
    if not folds:
        return spec
    assignment = replace(spec.assignment, rhs=rhs)
    statement = concretize(assignment)
    if _nested_sums(statement.rhs) or statement.top_sums != spec.statement.top_sums:
        return spec
    var = {t.name: t for t in spec.tensors}
    for f in folds:
        var[f.name] = TensorVar(f.name, len(f.distinct), f.format, False)
    used = dict.fromkeys(a.name for a in assignment.accesses())
    before = {a.name for a in spec.assignment.accesses()}
    extra = tuple(t for t in spec.tensors if t.name not in before)  # a mask stays
    return replace(
        spec,
        assignment=assignment,
        statement=statement,
        tensors=tuple(var[n] for n in used) + extra,
        indices=tuple(dict.fromkeys(i for a in assignment.accesses() for i in a.indices)),
        semantics=semantics,
        derived=spec.derived + tuple(folds),
    )


def _nested_sums(expr: CExpr) -> bool:
    """Does ``expr`` hold a sum (one the statement did not lift to enclose everything)?"""
    return isinstance(expr, Sum) or any(_nested_sums(c) for c in children(expr))


def _walk(spec: Spec, expr: Expr, folds: list[Folded]) -> Expr:
    """``expr`` with every chain regrouped (`_regroup_chain`), inner ones first; a chain
    with nothing to regroup is returned as written."""
    match expr:
        case BinOp(op="*" | "/"):
            written: Chain = []
            _flatten(expr, False, written)
            chain = [(_walk(spec, f, folds), d) for f, d in written]
            grouped = _regroup_chain(spec, chain, folds)
            if grouped is not None:
                return _rebuild(grouped)
            if all(f is w for (f, _), (w, _) in zip(chain, written, strict=True)):
                return expr
            return _rebuild(chain)
        case BinOp(left=left, right=right):
            return replace(expr, left=_walk(spec, left, folds), right=_walk(spec, right, folds))
        case Neg(operand=x):
            return replace(expr, operand=_walk(spec, x, folds))
        case Call(args=args):
            return replace(expr, args=tuple(_walk(spec, a, folds) for a in args))
        case _:
            return expr


def _flatten(expr: Expr, divides: bool, chain: Chain) -> None:
    """The factors of a chain, left to right: through both sides of ``*`` and the left of
    ``/``; the right of ``/`` is one divisor (its own chain, regrouped by `_walk`)."""
    match expr:
        case BinOp(op="*", left=left, right=right) if not divides:
            _flatten(left, False, chain)
            _flatten(right, False, chain)
        case BinOp(op="/", left=left, right=right) if not divides:
            _flatten(left, False, chain)
            chain.append((right, True))
        case _:
            chain.append((expr, divides))


def _rebuild(chain: Chain) -> Expr:
    """The chain as left-associated ``*`` and ``/`` (its first factor is a numerator)."""
    out = chain[0][0]
    for factor, divides in chain[1:]:
        out = BinOp("/" if divides else "*", out, factor)
    return out


def _regroup_chain(spec: Spec, chain: Chain, folds: list[Folded]) -> Chain | None:
    """``chain`` with each qualifying group of dense factors replaced by one `Folded`
    access at the place of its first member; None when no group qualifies."""
    # masks, derived inputs, and the folds of inner chains (not yet in ``spec``)
    skip = spec.patterns | {d.name for d in (*spec.derived, *folds)}
    groups: dict[frozenset[str], list[int]] = {}
    for n, (factor, _) in enumerate(chain):
        if (
            isinstance(factor, Access)
            and factor.indices
            and len(set(factor.indices)) == len(factor.indices)
            and factor.name not in skip
            and spec.tensor(factor.name).is_dense
        ):
            groups.setdefault(frozenset(factor.indices), []).append(n)
    # the variables of each numerator that reads a sparse tensor
    sparse = [
        {i for a in accesses(factor) for i in a.indices}
        for factor, divides in chain
        if not divides
        and any(a.name not in skip and not spec.tensor(a.name).is_dense for a in accesses(factor))
    ]
    out: dict[int, tuple[Expr, bool] | None] = {}
    for over, members in groups.items():
        if len(members) < 2 or not any(over < v for v in sparse):
            continue
        fold = _fold(spec, [chain[n] for n in members], folds)
        folds.append(fold)
        out[members[0]] = (Access(fold.name, fold.distinct), fold.factors[0].divides)
        out.update(dict.fromkeys(members[1:]))
    if not out:
        return None
    kept = (out.get(n, f) for n, f in enumerate(chain))
    return [f for f in kept if f is not None]


def _fold(spec: Spec, members: Chain, folds: list[Folded]) -> Folded:
    """The `Folded` input of a group of dense accesses over one variable set: numerators
    first, in order, then divisors; the modes and layout of the first member."""
    ordered = [m for m in members if not m[1]] + [m for m in members if m[1]]
    factors = []
    for read, divides in ordered:
        assert isinstance(read, Access)
        factors.append(Factor(spec.tensor(read.name), read.indices, divides))
    first = members[0][0]
    assert isinstance(first, Access)
    taken = {t.name for t in spec.tensors} | {d.name for d in (*spec.derived, *folds)}
    name = next(
        c for k in range(len(taken) + 1) if (c := f"{first.name}_fold{k or ''}") not in taken
    )
    fmt: Format = spec.tensor(first.name).format
    return Folded(name, first.indices, fmt, tuple(factors))
