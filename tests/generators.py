"""Random statements and formats, shared by the differential tests and the fuzzer."""

from __future__ import annotations

import random

INDICES = ("i", "j", "k")


def random_statement(
    r: random.Random,
    depth: int,
    stop: float,
    accumulate: float = 0.0,
    divide: float = 0.05,
    max_free: int = 2,
) -> tuple[str, dict[str, tuple[str, ...]]]:
    """``lhs (+)= rhs`` over tensors T0, T1, ... of order 0-3 on i, j, k, with ``+ - * /``
    (a ``/`` with probability ``divide``), literals and unary minus; every binary operation
    is written in explicit parentheses, so a sum inside a parenthesised numerator must stay
    there. The output has at most ``max_free`` indices. Returns the text and each tensor's
    index list."""
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
        op = r.choice("+-*") if r.random() >= divide else "/"
        text = f"({expr(level - 1)} {op} {expr(level - 1)})"
        return f"-{text}" if r.random() < 0.1 else text

    rhs = expr(depth)
    used = sorted({i for ix in tensors.values() for i in ix})
    free = r.sample(used, r.randint(0, min(max_free, len(used)))) if used else []
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


def random_output_format(r: random.Random, order: int) -> str:
    """A sparse output format that outputs support, in a random mode ordering: a dense
    prefix, then compressed levels (optionally a dense block below them) or a COO chain."""
    prefix = r.randint(0, order - 1)
    rest = order - prefix
    if rest > 1 and r.random() < 0.25:
        letters = "d" * prefix + "u" + "q" * (rest - 1)
    else:
        block = r.randint(0, rest - 1) if r.random() < 0.3 else 0
        letters = "d" * prefix + "s" * (rest - block) + "d" * block
    ordering = list(range(order))
    r.shuffle(ordering)
    return f"{letters}:{','.join(map(str, ordering))}"


#: GPU mappings with a split loop: (outer unit, inner units); each unit gets a random race
#: strategy, Atomics across warps among them (a warp's partial sums combined by atomics)
GPU_UNITS = (
    ("GPUBlock", "GPUThread"),
    ("GPUBlock", "GPUWarp"),
    ("GPUWarp", "GPUThread"),
)
GPU_RACES = ("NoRaces", "Atomics", "ParallelReduction", "IgnoreRaces")


def random_gpu_schedule(
    r: random.Random, loops: list[str], indexed_by: dict[str, list[str]]
) -> list[str]:
    """A GPU mapping (legal or not): the outermost loop on blocks, an inner loop split (over
    its positions when a sparse operand iterates it) into warps and lanes, random races."""
    commands = [f"parallelize({loops[0]},GPUBlock,{r.choice(GPU_RACES)})"]
    if len(loops) < 2:
        return commands
    var = r.choice(loops[1:])
    if var in indexed_by and r.random() < 0.7:
        commands.append(f"pos({var},{var}p,{r.choice(indexed_by[var])})")
        var = f"{var}p"
    warp, lane = f"{var}w", f"{var}l"
    commands.append(f"split({var},{warp},{lane},{r.choice([32, 32, 4])})")
    outer, inner = r.choice(GPU_UNITS[1:])
    commands.append(f"parallelize({warp},{outer},{r.choice(GPU_RACES)})")
    commands.append(f"parallelize({lane},{inner},{r.choice(GPU_RACES)})")
    return commands
