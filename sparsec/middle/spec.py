"""The typed kernel description every later stage reads: statement, tensors, formats.

Format defaults (the contract of `sparsec.kernel`): with no formats at all, the
highest-order input (first on ties) is sparse (compressed vector, CSR, CSF) and every
other tensor dense; when some formats are given, unlisted tensors are dense. Scalars
(order 0) have the empty format.

``C(i,j) += E`` into a sparse ``C`` is compiled as ``C(i,j) = C_old(i,j) + (E)``: the
caller passes the current ``C`` (under the name ``C``; `TensorVar.argument`) and gets a
new tensor whose pattern is the union of the current one and ``E``'s, as with ``=``
into a sparse output of ``C_old + E`` (docs/semantics.md, Outputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..base.errors import FormatError, NotationError
from ..frontend.concrete import Statement, concretize
from ..frontend.notation import Access, Assignment, BinOp
from ..frontend.semantics import DEFAULT, Semantics
from ..frontend.semirings import check_expression, semiring
from ..tensors.formats import Format, default_sparse, dense, parse_format
from ..tensors.layout import OutputLayout


@dataclass(frozen=True)
class TensorVar:
    name: str
    order: int
    format: Format
    is_output: bool
    #: the keyword a kernel call passes this input under ("" means ``name``): the current
    #: value of a sparse output that ``+=`` adds to is an input of its own, passed as the
    #: output's name
    argument: str = ""

    #: the format has only dense levels (cached: checked on every kernel call)
    is_dense: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_dense", self.format.is_dense)
        if not self.argument:
            object.__setattr__(self, "argument", self.name)


@dataclass(frozen=True, slots=True)
class Derived:
    """Input ``name`` is not passed by the caller: it is computed at call time from the
    argument ``source`` (a tensor the caller passes) read as ``indices`` (the access as
    written, one index per mode of ``source``), and stored in ``format``.

    The entries kept are those whose coordinates agree wherever ``indices`` repeats a
    variable (an equality filter: ``A(i,i)``), on one mode per distinct variable, in first
    use order; with no repeat this is a re-layout of ``source`` (another mode ordering or
    level format) so that a loop order fits every operand (`sparsec.middle.derive`).
    """

    name: str
    source: TensorVar
    indices: tuple[str, ...]
    format: Format

    @property
    def distinct(self) -> tuple[str, ...]:
        """The derived tensor's modes: each variable of ``indices`` once, first use first."""
        return tuple(dict.fromkeys(self.indices))

    @property
    def reads(self) -> tuple[tuple[TensorVar, tuple[str, ...]], ...]:
        """The passed tensors it is computed from, each with the access as written."""
        return ((self.source, self.indices),)


@dataclass(frozen=True, slots=True)
class Factor:
    """One dense factor of a `Folded` input: ``source`` read as ``indices`` (each variable
    once), multiplied in, or divided by when ``divides``."""

    source: TensorVar
    indices: tuple[str, ...]
    divides: bool


@dataclass(frozen=True, slots=True)
class Folded:
    """Input ``name`` is not passed by the caller: it is the product (and quotient) of
    dense ``factors`` over the same variables ``distinct``, computed at call time in the
    kernel's dtype and stored densely in ``format``, from left to right: the numerators
    in order, then each divisor (or, with no numerator, the product of the divisors,
    which the statement then divides by). ``A(i,j) * p(j) / g(j)`` reads
    ``A(i,j) * T(j)`` with ``T = p / g``: the division is done once per ``j``, not once
    per stored entry (`sparsec.middle.regroup`)."""

    name: str
    distinct: tuple[str, ...]
    format: Format
    factors: tuple[Factor, ...]

    @property
    def reads(self) -> tuple[tuple[TensorVar, tuple[str, ...]], ...]:
        """The passed tensors it is computed from, each with the access as written."""
        return tuple((f.source, f.indices) for f in self.factors)


@dataclass(frozen=True, slots=True)
class Spec:
    assignment: Assignment
    statement: Statement
    #: output first, then inputs in order of first use
    tensors: tuple[TensorVar, ...]
    #: every index variable, left-hand side first, then first use on the right
    indices: tuple[str, ...]
    #: division convention, semiring and mask (`sparsec.frontend.semantics`)
    semantics: Semantics = DEFAULT
    #: inputs computed at call time from passed tensors: a re-layout where no loop order
    #: fits the formats as given, the diagonal of a repeated index (`Derived`), and a
    #: product of dense factors over fewer variables than the entries it scales (`Folded`)
    derived: tuple[Derived | Folded, ...] = ()
    #: a statement over mapped formats: how it was rewritten over level spaces, said in
    #: the generated header (`sparsec.middle.demap`)
    maps: tuple[str, ...] = ()
    #: index variables whose extent the formats fix: a block's inner index, a slot (the
    #: generated code uses the number; the runtime binds no other, `Demapped.level_dims`)
    static: tuple[tuple[str, int], ...] = ()

    @property
    def pattern(self) -> str:
        """The mask's tensor (`apply_mask`), whose accesses read as the value 1, or ""."""
        return self.semantics.mask.lstrip("~")

    @property
    def patterns(self) -> frozenset[str]:
        """The names whose accesses read as the mask: `pattern` and its re-layouts
        (`Derived` from it, when no loop order fits the mask's format as given)."""
        if not self.pattern:
            return frozenset()
        return frozenset(
            {self.pattern}
            | {d.name for d in self.derived if any(t.name == self.pattern for t, _ in d.reads)}
        )

    @property
    def output(self) -> TensorVar:
        return self.tensors[0]

    @property
    def inputs(self) -> tuple[TensorVar, ...]:
        return self.tensors[1:]

    @property
    def formats(self) -> dict[str, Format]:
        return {t.name: t.format for t in self.tensors}

    def tensor(self, name: str) -> TensorVar:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


FormatsArg = Mapping[str, "str | Format"] | None


def make_spec(
    assignment: Assignment, formats: FormatsArg = None, semantics: Semantics = DEFAULT
) -> Spec:
    # '-', '/' and functions have no meaning under a semiring other than plus_times
    check_expression(assignment.rhs, semiring(semantics.semiring))
    if semantics.mask:
        assignment = apply_mask(assignment, semantics.mask, formats)
        formats = mask_formats(assignment, semantics.mask, formats)
    orders: dict[str, int] = {}
    for access in assignment.accesses():
        orders.setdefault(access.name, access.order)
    output = assignment.lhs.name
    given = _formats_mapping(formats, orders, output)
    if not given:
        inputs = [n for n in orders if n != output]
        widest = max(inputs, key=lambda n: orders[n], default=None)
        if widest is not None and orders[widest] > 0:
            given[widest] = default_sparse(orders[widest])
    tensors = tuple(
        TensorVar(
            name,
            order,
            parse_format(given[name], order, name) if name in given else dense(order),
            name == output,
        )
        for name, order in orders.items()
    )
    if semantics.semiring != "plus_times":
        _no_padding(tensors, semantics.semiring)
    out = tensors[0]
    if not out.format.is_dense:
        OutputLayout.of(out.format, output)  # raises for layouts that cannot be appended
        if assignment.accumulate:
            assignment, tensors = _sparse_accumulate(assignment, tensors)
    indices = tuple(dict.fromkeys(i for a in assignment.accesses() for i in a.indices))
    statement = concretize(assignment, semiring(semantics.semiring).distributive)
    return Spec(assignment, statement, tensors, indices, semantics)


def apply_mask(assignment: Assignment, mask: str, formats: FormatsArg) -> Assignment:
    """The structural mask ``M`` as a factor: ``C(lhs) = M(lhs) * (rhs)``, ``M`` indexed
    by the left-hand side. ``M`` is a pattern (`Spec.pattern`): the lowerer reads its
    value as 1, so it only intersects the co-iteration (its stored entries, explicit zeros
    included, drive the loops of the left-hand side's indices). ``~M`` is the same factor
    marked `Access.complement`: co-iterated, it computes only where ``M`` stores no entry
    (`middle.lattice.build` skips the points where ``M``'s last level is present).
    """
    name = mask.removeprefix("~")
    if name.startswith("~"):
        raise NotationError(f"mask {mask!r}: '~' (the complement) is written once, as in '~M'")
    if not name.isidentifier():
        raise NotationError(
            f"mask {mask!r} is not a tensor name: write an identifier such as 'M' or '~M'"
        )
    taken = {a.name for a in assignment.accesses()}
    if name in taken:
        raise NotationError(
            f"mask {name!r} is already a tensor of {assignment}: the mask is an extra input "
            f"passed at call time; give it a name of its own (tensors: {', '.join(taken)})"
        )
    lhs = assignment.lhs
    if not lhs.order:
        raise NotationError(
            f"mask {mask!r} on the scalar output {lhs.name!r}: a mask selects entries of an "
            f"indexed output (M is indexed by the left-hand side's indices), and a scalar has "
            f"none; drop mask=, or keep an index on the left (y(i) = ...) and sum y yourself"
        )
    complement = mask.startswith("~")
    pattern = Access(name, lhs.indices, lhs.span, lhs.index_spans, complement, pattern=True)
    return replace(assignment, rhs=BinOp("*", pattern, assignment.rhs, assignment.rhs.span))


def mask_formats(assignment: Assignment, mask: str, formats: FormatsArg) -> FormatsArg:
    """``formats`` with the mask's: as given, else the output's when sparse, else the
    default sparse format of its order (CSR for a matrix)."""
    name = mask.removeprefix("~")
    if formats is not None and not isinstance(formats, Mapping):
        return formats  # refused with its message by `_formats_mapping`
    given = dict(formats or {})
    if name in given:
        return given
    order = assignment.lhs.order
    out = given.get(assignment.lhs.name)
    if out is not None and not parse_format(out, order, assignment.lhs.name).is_dense:
        given[name] = out
    elif order:
        given[name] = default_sparse(order)
    if formats is None:
        # the default of `make_spec` with no formats at all: the widest input is sparse
        inputs = [a for a in assignment.accesses() if a.name not in (name, assignment.lhs.name)]
        widest = max(inputs, key=lambda a: a.order, default=None)
        if widest is not None and widest.order:
            given[widest.name] = default_sparse(widest.order)
    return given


def _no_padding(tensors: tuple[TensorVar, ...], ring: str) -> None:
    """A padded singleton's filler entries (`Format.pads`) would be values under a semiring
    whose add is min, max or or: refuse them rather than compute with them."""
    for t in tensors:
        if t.format.pads:
            raise FormatError(
                f"{t.name} is stored as {t.format}, whose singleton level pads rows with stored "
                f"zeros at coordinate 0; under semiring {ring!r} those would be real values. "
                f"Store {t.name} with a compressed level instead (e.g. 'csr', 'coo', 'csf')"
            )


def _sparse_accumulate(
    assignment: Assignment, tensors: tuple[TensorVar, ...]
) -> tuple[Assignment, tuple[TensorVar, ...]]:
    """``C += E`` into a sparse ``C``: ``C = C_old + (E)`` with ``C_old`` passed as ``C``
    (the rewritten assignment and its tensors)."""
    out = tensors[0]
    taken = {t.name for t in tensors}
    old = next(n for k in range(len(taken) + 1) if (n := f"{out.name}_old{k or ''}") not in taken)
    lhs = assignment.lhs
    current = Access(old, lhs.indices, lhs.span, lhs.index_spans)
    rhs = BinOp("+", current, assignment.rhs, assignment.rhs.span)
    rewritten = replace(assignment, rhs=rhs, accumulate=False)
    previous = TensorVar(old, out.order, out.format, False, argument=out.name)
    return rewritten, (out, previous, *tensors[1:])


def _formats_mapping(formats: object, orders: Mapping[str, int], output: str) -> dict[str, Any]:
    """``formats`` as a dict of tensor name -> spec, or a `FormatError` that says what to write."""
    if formats is None:
        return {}
    example = next((n for n in orders if n != output and orders[n] == 2), None)
    example = example or next((n for n in orders if n != output and orders[n]), output)
    if not isinstance(formats, Mapping):
        if isinstance(formats, str | Format):
            spelled = formats if isinstance(formats, str) else str(formats)
            fix = f"formats={{{example!r}: {spelled!r}}}"
            what = f"the format {spelled!r} alone"
        else:
            fix = f"formats={{{example!r}: 'csr'}}"
            what = f"{type(formats).__name__} {formats!r}"
        raise FormatError(
            f"formats must be a mapping from tensor name to format, not {what}: say which "
            f"tensor each format is for, e.g. {fix} (tensors: {', '.join(orders)})"
        )
    given: dict[str, Any] = {}
    for name, spec in formats.items():
        if not isinstance(name, str):
            raise FormatError(
                f"formats keys are tensor names (strings), not {type(name).__name__} {name!r}; "
                f"e.g. formats={{{example!r}: {spec!r}}} (tensors: {', '.join(orders)})"
            )
        if name not in orders:
            raise FormatError(
                f"format given for {name!r}, which is not a tensor of this expression "
                f"(tensors: {', '.join(orders)})"
            )
        given[name] = spec
    return given
