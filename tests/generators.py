"""Random statements and formats, shared by the differential tests and the fuzzer."""

from __future__ import annotations

import random

INDICES = ("i", "j", "k")


def random_statement(
    r: random.Random, depth: int, stop: float, accumulate: float = 0.0
) -> tuple[str, dict[str, tuple[str, ...]]]:
    """``lhs (+)= rhs`` over tensors T0, T1, ... of order 0-3 on i, j, k, with ``+ - * /``,
    literals and unary minus; returns the text and each tensor's index list."""
    tensors: dict[str, tuple[str, ...]] = {}

    def leaf() -> str:
        roll = r.random()
        if roll < 0.1:
            return str(r.choice([2, 0.5, 3]))
        name = f"T{len(tensors)}"
        if roll < 0.2:
            tensors[name] = ()
            return name
        indices = tuple(r.sample(INDICES, r.randint(1, 3)))
        tensors[name] = indices
        return f"{name}({','.join(indices)})"

    def expr(level: int) -> str:
        if level == 0 or r.random() < stop:
            return leaf()
        op = r.choice("+-*") if r.random() < 0.95 else "/"
        text = f"({expr(level - 1)} {op} {expr(level - 1)})"
        return f"-{text}" if r.random() < 0.1 else text

    rhs = expr(depth)
    used = sorted({i for ix in tensors.values() for i in ix})
    free = r.sample(used, r.randint(0, min(2, len(used)))) if used else []
    lhs = f"O({','.join(free)})" if free else "o"
    op = "+=" if r.random() < accumulate else "="
    return f"{lhs} {op} {rhs}", tensors


def random_formats(
    r: random.Random, tensors: dict[str, tuple[str, ...]], coo: float
) -> dict[str, str]:
    """Per tensor: dense/compressed levels (or a COO chain) in a random mode ordering."""
    formats = {}
    for name, ix in tensors.items():
        if not ix:
            continue
        if r.random() < coo and len(ix) > 1:
            letters = "u" + "q" * (len(ix) - 1)
        else:
            letters = "".join(r.choice("ds") for _ in ix)
        ordering = list(range(len(ix)))
        r.shuffle(ordering)
        formats[name] = f"{letters}:{','.join(map(str, ordering))}"
    return formats
