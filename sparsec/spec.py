"""The typed kernel description every later stage reads: statement, tensors, formats.

Format defaults (the contract of `sparsec.kernel`): with no formats at all, the
highest-order input (first on ties) is sparse (compressed vector, CSR, CSF) and every
other tensor dense; when some formats are given, unlisted tensors are dense. Scalars
(order 0) have the empty format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .assemble import OutputLayout
from .concrete import Statement, concretize
from .errors import FormatError
from .formats import Format, default_sparse, dense, parse_format
from .notation import Assignment


@dataclass(frozen=True)
class TensorVar:
    name: str
    order: int
    format: Format
    is_output: bool

    #: the format has only dense levels (cached: checked on every kernel call)
    is_dense: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_dense", self.format.is_dense)


@dataclass(frozen=True, slots=True)
class Spec:
    assignment: Assignment
    statement: Statement
    #: output first, then inputs in order of first use
    tensors: tuple[TensorVar, ...]
    #: every index variable, left-hand side first, then first use on the right
    indices: tuple[str, ...]

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


def make_spec(assignment: Assignment, formats: FormatsArg = None) -> Spec:
    orders: dict[str, int] = {}
    for access in assignment.accesses():
        orders.setdefault(access.name, access.order)
    output = assignment.lhs.name
    given = dict(formats or {})
    for name in given:
        if name not in orders:
            raise FormatError(
                f"format given for {name!r}, which is not a tensor of this expression "
                f"(tensors: {', '.join(orders)})"
            )
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
    out = tensors[0]
    if not out.format.is_dense:
        OutputLayout.of(out.format, output)  # raises for layouts that cannot be appended
        if assignment.accumulate:
            raise FormatError(
                f"output {output!r} is sparse ({out.format}); '+=' into a sparse output is not "
                f"supported: write {output} = {output} + ... with {output} as an input instead"
            )
    indices = tuple(dict.fromkeys(i for a in assignment.accesses() for i in a.indices))
    return Spec(assignment, concretize(assignment), tensors, indices)
