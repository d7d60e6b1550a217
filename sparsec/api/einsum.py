"""`einsum`: numpy's einsum spelling over the same compiler.

``einsum("ij,j->i", A, x)`` is the statement ``O(i) = T0(i,j) * T1(j)``: the subscript
letters are the index variables, operand ``n`` is tensor ``Tn``, and the output ``O``. The
implicit form (no ``->``) keeps numpy's rule: the output is the letters used exactly once,
in alphabetical order. Index notation sums every variable absent from the output over the
product, which is einsum's contraction; a letter repeated within one operand (``ii->``,
``ii->i``) reads its diagonal, as a repeated index variable does.

Formats come from the operands: a `Tensor`, scipy or torch sparse operand is read in its
own format (no conversion), numpy and strided torch operands are dense, numbers are scalar
operands (an empty subscript). The output is dense (numpy, or torch when an operand is
torch) unless ``out_format`` names a sparse format; then it is a `Tensor` assembled by the
kernel. The kernel comes from `kernel`'s memo, keyed by the statement and the formats.
"""

from __future__ import annotations

import re
from typing import Any

from ..base.errors import InputError, ParseError, ShapeError
from ..tensors.formats import Format, parse_format
from .array import dense_operand, scalar_operand, sparse_operand
from .kernel import kernel

_TERM = re.compile(r"[A-Za-z]*")


def _terms(subscripts: str, count: int) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, validated (a `ParseError` pointing at the
    fault for a bad spelling, an `InputError` for a wrong number of operands)."""
    if not isinstance(subscripts, str):
        raise InputError(f"einsum subscripts must be a string, not {type(subscripts).__name__}")
    text = subscripts.replace(" ", "")
    if "..." in text:
        at = text.index("...")
        raise ParseError(
            "einsum: '...' (broadcast dimensions) is not supported; name every mode",
            source=text,
            span=(at, at + 3),
        )
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    offset = 0
    for term in (*terms, output):
        if not _TERM.fullmatch(term):
            bad = next(i for i, ch in enumerate(term) if not _TERM.fullmatch(ch))
            at = text.index(term, offset) + bad if term else offset
            raise ParseError(
                f"einsum: {term[bad]!r} is not a subscript letter (letters, ',' between "
                "operands, one '->' before the output)",
                source=text,
                span=(at, at + 1),
            )
        offset = text.find(term, offset) + len(term)
    if len(terms) != count:
        raise InputError(
            f"einsum: the subscripts {subscripts!r} name {len(terms)} operand(s) but "
            f"{count} were given"
        )
    used = "".join(terms)
    if not arrow:
        output = "".join(sorted(c for c in set(used) if used.count(c) == 1))
    for c in output:
        if output.count(c) > 1 or c not in used:
            why = "is repeated in the output" if c in used else "appears in no operand"
            at = len(inputs) + 2 + output.index(c)
            raise ParseError(
                f"einsum: output subscript {c!r} {why}", source=text, span=(at, at + 1)
            )
    return terms, output


def einsum(subscripts: str, *operands: Any, out_format: str | Format | None = None) -> Any:
    """numpy's ``einsum(subscripts, *operands)`` compiled by sparsec (module docstring).

    >>> y = sparsec.einsum("ij,j->i", A, x)           # SpMV, A read in its own format
    >>> C = sparsec.einsum("ik,kj->ij", A, B, out_format="csr")   # sparse result
    """
    terms, output = _terms(subscripts, len(operands))
    formats: dict[str, Format] = {}
    inputs: dict[str, Any] = {}
    extents: dict[str, tuple[int, int]] = {}
    accesses = []
    for n, (term, operand) in enumerate(zip(terms, operands, strict=True)):
        name = f"T{n}"
        sparse = sparse_operand(operand)
        value: Any = sparse if sparse is not None else scalar_operand(operand) if not term else None
        if value is None:
            value = dense_operand(operand)
            if value is None:
                raise InputError(
                    f"einsum operand {n} is a {type(operand).__name__}; operands are sparsec "
                    "Tensors, scipy/torch sparse or dense numpy/torch arrays, or numbers"
                )
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) != len(term):
            raise ShapeError(
                f"einsum operand {n} has order {len(shape)} but its subscripts {term!r} "
                f"name {len(term)} mode(s)"
            )
        for c, extent in zip(term, shape, strict=True):
            seen = extents.setdefault(c, (extent, n))
            if seen[0] != extent:
                raise ShapeError(
                    f"einsum: subscript {c!r} is {seen[0]} in operand {seen[1]} but {extent} "
                    f"in operand {n}"
                )
        if term:  # unlisted tensors would take the default formats (the largest sparse)
            formats[name] = (
                sparse.format if sparse is not None else parse_format("dense", len(term))
            )
        inputs[name] = value
        accesses.append(f"{name}({','.join(term)})" if term else name)
    out = parse_format(out_format or "dense", len(output), "einsum output") if output else None
    if out is not None:
        formats["O"] = out
    lhs = f"O({','.join(output)})" if output else "O"
    return kernel(f"{lhs} = {' * '.join(accesses)}", formats)(**inputs)
