"""The kernel ABI: one flat parameter list, defined here and nowhere else.

Every target's kernel takes, in this order:

1. for each tensor (output first, then inputs in order of first use):
   a scalar input is one value parameter; otherwise, for each storage level ``k``
   (1-based in names, as in TACO) the level's arrays (``A2_pos``, ``A2_crd``), then
   the values ``A_vals``;
2. one ``int64`` extent per index variable (``i_dim``), in `Spec.indices` order;
3. ``sc_threads``: the number of CPU threads parallel loops may use;
4. on C kernels whose parallel loop runs in column bands (`sparsec.passes.bands`) only,
   ``sc_band``: the register tiles per band for this call (0: whole rows);
5. on those of them whose tiles' reduction walks one compressed level only, ``sc_depth``:
   the coordinates of that level per depth block for this call (0: one block).

Printers declare parameters from `Signature.params`; loaders fill them from the same
list, so the two cannot drift apart.

A C kernel none of whose parameters is a scalar value also exports
``sparsec_kernel_packed(const void*)``: the same list as int64s in one array (arrays by
address, in this order), which the runtime's fast path passes as one bytes object. One
ctypes argument costs much less than eleven (docs/decisions.md, "A repeated call").

No user text reaches generated code: identifiers come from validated names plus fixed
suffixes, and `Namer` makes every identifier unique and keeps clear of C/CUDA keywords.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..ir import nodes as ir
from ..ir.nodes import I64, IDX, VAL
from ..middle.spec import Spec

INT = "int"

# The entry points a generated library exports (all take the parameter list above, except
# the packed entry, which takes it as one int64 array, and the emulation's launcher, which
# takes the grid and block first). The printers name them from here and the loaders look
# them up from here.
#: the kernel (C); the ``__global__`` kernel (CUDA)
KERNEL_NAME = "sparsec_kernel"
#: a sparse output's symbolic phase: counts each output level's positions into ``sc_sizes``
ASSEMBLE_NAME = "sparsec_assemble"
#: a sparse output's single pass: appends into capacities the runtime bounded up front
APPEND_NAME = "sparsec_append"
#: a chunked single pass's rows of one chunk (`sparsec.lower.chunks`): a static function
#: taking the kernel's parameters and the chunk
APPEND_ROWS_NAME = "sparsec_append_rows"
#: the rows of the kernel's parallel loop, in a function of their own (`lower.outline`)
ROWS_NAME = "sparsec_rows"
CHUNK_PARAM = "sc_chunk"
#: the kernel with its arguments in one int64 array (C kernels without a scalar input)
PACKED_NAME = "sparsec_kernel_packed"
#: the CUDA emulation's launcher: ``(grid, block, <parameters>)``
LAUNCH_NAME = "sparsec_launch"
#: a GPU kernel's workspace (SpGEMM's dense rows), one slice per thread, allocated by the
#: runtime: role -> (parameter name, element type)
GPU_WORKSPACE = {
    "vals": ("sc_ws_vals", "val"),
    "seen": ("sc_ws_seen", "u64"),
    "list": ("sc_ws_list", "i64"),
}
#: its per-row hash tables (`sparsec.lower.workspace.Hash`): the mode (one element: 0 the
#: dense rows above, 1 the tables, 2 a tally of scatters), each row's offset into the
#: tables (rows + 1), the keys (-1: empty) and the values
GPU_HASH = {
    "mode": ("sc_ws_mode", "i64"),
    "off": ("sc_ws_off", "i64"),
    "keys": ("sc_ws_keys", "i64"),
    "hvals": ("sc_ws_hvals", "val"),
}
#: its launcher of a sparse output's counting kernel (``sparsec_assemble``)
LAUNCH_ASSEMBLE_NAME = "sparsec_launch_assemble"

# Kernel return statuses: the only codes a generated kernel returns, for every target. The
# runtime turns each non-zero status into the error that names it (the one status -> error
# function, `sparsec.runtime.loaded.status_error`).
#: success
OK = 0
#: a workspace (or a per-thread copy of the output) could not be allocated
OUT_OF_MEMORY = 2
#: the inputs break a bound the schedule relies on (its entry checks)
BOUND_VIOLATED = 3
#: an appended output level would pass the capacity the runtime gave it (``sc_sizes``): the
#: runtime's bound was wrong; nothing was written out of bounds
CAPACITY_EXCEEDED = 4
#: the kernel was built with the register-tile stages of another extent than the call's
#: (`sparsec.passes.stages`): nothing was written; the runtime builds it with all of them
STAGES_MISSING = 5
#: every status a kernel may return, by name
STATUSES = {
    "OK": OK,
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "BOUND_VIOLATED": BOUND_VIOLATED,
    "CAPACITY_EXCEEDED": CAPACITY_EXCEEDED,
    "STAGES_MISSING": STAGES_MISSING,
}

# A sparse output's arrays, which the runtime allocates and the kernel fills.
#: blocks of spare ``vals`` the runtime allocates past an output's last dense block (the
#: kernel may write the position one past a full block: `sparsec.lower.assemble`)
BLOCK_SLACK = 1
#: extents of the last output level the runtime allocates beyond its entry bound, so the
#: single pass's up-front check of a loop (at most its extent) never fails a correct bound
LAST_LEVEL_SLACK = 1
#: the chunk table of a chunked single pass (`sparsec.lower.chunks`), in ``sc_sizes`` after
#: the output's ``L`` level sizes, for ``C`` chunks: ``sc_sizes[L]`` is ``C``, then each
#: part's entry for chunk ``c`` at ``L + start + times * C + c``: part -> (start, times)
CHUNK_TABLE = {
    "row": (1, 0),  # chunk c's first row (C + 1 entries: the last is the rows)
    "region": (2, 1),  # chunk c's region start (C + 1 entries: the last ends it)
    "end": (3, 2),  # written by the kernel: the end chunk c reached (-1: it stopped)
}


def chunk_table(levels: int, chunks: int) -> tuple[int, int, int, int]:
    """Where the chunk table's row starts, region starts and ends begin in ``sc_sizes``,
    and the table's length, for an output of ``levels`` levels in ``chunks`` chunks."""
    row, region, end = (levels + a + b * chunks for a, b in CHUNK_TABLE.values())
    return row, region, end, end + chunks


#: the build's macro naming the extent of a parameter whose register-tile stages are
#: guarded (`sparsec.passes.stages`): ``SC_HINT_<parameter>``
HINT_PREFIX = "SC_HINT_"


def stage_hints(extents: tuple[str, ...], values: dict[str, int]) -> str:
    """The lines that build a kernel for the extents ``values`` (by parameter) of its
    guarded ``extents``, put before its source: ``#define SC_HINT_p <extent>``."""
    return "".join(f"#define {HINT_PREFIX}{p} {int(values[p])}\n" for p in extents if p in values)


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

RESERVED = frozenset(
    """auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while bool true false class new delete this
    template typename namespace private public protected virtual operator friend using
    asm main NULL nullptr errno math_errhandling min max abs fabs exp log sqrt pow memset
    memcpy
    blockIdx threadIdx blockDim gridDim warpSize dim3 atomicAdd""".split()
)


class Namer:
    """Hands out unique C identifiers; a base already taken gets a ``_2``, ``_3`` suffix."""

    def __init__(self) -> None:
        self._used: set[str] = set(RESERVED)

    def fresh(self, base: str) -> str:
        if not _IDENT.match(base):
            raise ValueError(f"not an identifier: {base!r}")
        if base.startswith("_") or base.startswith("sc_"):
            base = "u" + base  # leading underscores are the implementation's; sc_ is ours
        if base.endswith("_t") or (len(base) > 1 and base.upper() == base):
            base += "_u"  # type names (POSIX *_t) and macros (NAN, INT32_MAX) stay untouched
        name, n = base, 2
        while name in self._used:
            name, n = f"{base}_{n}", n + 1
        self._used.add(name)
        return name

    def reserve(self, name: str) -> str:
        """Claim a fixed internal name (must still be free)."""
        if name in self._used:
            raise ValueError(f"name {name!r} already used")
        self._used.add(name)
        return name


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    #: "array" (pointer) or "value"
    kind: str
    #: symbolic element type: VAL, IDX, I64 or INT
    type: str
    #: "pos", "crd", "vals", "value", "dim", "sizes", "threads", "band" or "depth"
    field: str
    tensor: str | None = None
    level: int = -1
    index: str | None = None
    writable: bool = False


@dataclass(frozen=True, slots=True)
class Signature:
    params: tuple[Param, ...]
    #: index variables whose extent the formats fix (`Spec.static`), by name
    static: tuple[tuple[str, int], ...] = ()

    def array(self, tensor: str, field: str, level: int = -1) -> str:
        for p in self.params:
            if p.tensor == tensor and p.field == field and p.level == level:
                return p.name
        raise KeyError((tensor, field, level))

    def value(self, tensor: str) -> str:
        return self.array(tensor, "value")

    def dim(self, index: str) -> str:
        for p in self.params:
            if p.field == "dim" and p.index == index:
                return p.name
        raise KeyError(index)

    def extent(self, index: str) -> ir.Expr:
        """The extent of ``index`` in the kernel's code: its number where the formats fix
        it (a block's inner index: loops the C compiler unrolls), else its parameter."""
        for name, size in self.static:
            if name == index:
                return ir.IntLit(size)
        return ir.Var(self.dim(index))

    @property
    def threads(self) -> str:
        return next(p.name for p in self.params if p.field == "threads")

    @property
    def sizes(self) -> str:
        return next(p.name for p in self.params if p.field == "sizes")


def signature(spec: Spec, namer: Namer) -> Signature:
    """The parameter list of ``spec``'s kernel, naming each parameter through ``namer``."""
    params: list[Param] = []
    threads = namer.reserve("sc_threads")
    for t in spec.tensors:
        if t.order == 0 and not t.is_output:
            params.append(Param(namer.fresh(t.name), "value", VAL, "value", t.name))
            continue
        for k, level in enumerate(t.format.levels):
            for field in level.arrays:
                name = namer.fresh(f"{t.name}{k + 1}_{field}")
                params.append(Param(name, "array", IDX, field, t.name, k, writable=t.is_output))
        params.append(
            Param(namer.fresh(f"{t.name}_vals"), "array", VAL, "vals", t.name, writable=t.is_output)
        )
    for index in spec.indices:
        params.append(Param(namer.fresh(f"{index}_dim"), "value", I64, "dim", index=index))
    if not spec.output.format.is_dense:
        # the assemble kernel reports the number of positions of each output level here
        params.append(Param(namer.reserve("sc_sizes"), "array", I64, "sizes", writable=True))
    params.append(Param(threads, "value", INT, "threads"))
    return Signature(tuple(params), spec.static)
