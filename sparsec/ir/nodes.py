"""Loop IR: the imperative program the lowerer builds and the printers render.

Small on purpose. Types are symbolic (``VAL`` = the kernel's value type, ``ACC`` = the
type its reductions accumulate in, ``IDX`` = its index type, ``I64`` = positions and
coordinates, ``BOOL``, ``U8`` a byte); a printer maps them to its
target's spelling. Loops carry an optional `Parallel` annotation and stores an
``atomic`` flag so parallel CPU and GPU mappings need no second IR.
"""

from __future__ import annotations

from dataclasses import dataclass

VAL = "val"
#: a reduction's accumulator: at least as wide as VAL (float32 sums in double on the C target)
ACC = "acc"
IDX = "idx"
I64 = "i64"
U64 = "u64"
BOOL = "bool"
#: a byte (a workspace's marks, `lower.where`)
U8 = "u8"
#: a vector of VAL lanes (C register tiles, `tile.py`)
VEC = "vec"


# ---------------------------------------------------------------- expressions
@dataclass(frozen=True, slots=True)
class Var:
    name: str


@dataclass(frozen=True, slots=True)
class IntLit:
    value: int


@dataclass(frozen=True, slots=True)
class FloatLit:
    value: float


@dataclass(frozen=True, slots=True)
class Load:
    """``array[index]``"""

    array: str
    index: Expr


@dataclass(frozen=True, slots=True)
class Bin:
    """Binary operator; ``op`` is a key of the printer's operator table."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "!"
    operand: Expr


@dataclass(frozen=True, slots=True)
class Call:
    """A helper or intrinsic the printer knows by name (``min``, ``max``)."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Select:
    """``cond ? then : other``"""

    cond: Expr
    then: Expr
    other: Expr


Expr = Var | IntLit | FloatLit | Load | Bin | Unary | Call | Select


# ----------------------------------------------------------------- statements
@dataclass(frozen=True, slots=True)
class Decl:
    """Declare a local ``name`` of symbolic ``type``, optionally initialised."""

    type: str
    name: str
    init: Expr | None = None


@dataclass(frozen=True, slots=True)
class Assign:
    """``target op value`` with ``op`` ``=`` or ``+=``."""

    target: Var | Load
    value: Expr
    op: str = "="
    #: parallel iterations may write this location: the printer emits an atomic update
    atomic: bool = False


@dataclass(frozen=True, slots=True)
class Parallel:
    """How a loop runs in parallel: unit (CPUThread, CPUVector, GPU...) and OpenMP schedule."""

    unit: str
    schedule: str = "static"
    #: name of a variable holding the chunk size, or "" for the runtime's default
    chunk: str = ""
    #: scalar variables combined with ``+`` across iterations (OpenMP ``reduction``)
    reduction: tuple[str, ...] = ()
    #: flag variables (0 or 1) combined with ``max`` across iterations
    flags: tuple[str, ...] = ()
    #: a further condition (a variable) for running in parallel at all
    only_if: str = ""
    #: loops shared out as one (OpenMP ``collapse``): this loop and the ones directly in it
    collapse: int = 1
    #: GPU lanes per group: a "lane" loop strides over a group of this many lanes of a
    #: warp, a "group" loop over the warp's 32 / lanes groups (see `lower.gpu_loops`)
    lanes: int = 32


@dataclass(frozen=True, slots=True)
class For:
    """``for (var = start; var < end; var++)`` (declares ``var`` as I64)."""

    var: str
    start: Expr
    end: Expr
    body: Block
    parallel: Parallel | None = None
    #: ask the compiler to unroll this many times (0: its own choice)
    unroll: int = 0


@dataclass(frozen=True, slots=True)
class While:
    cond: Expr
    body: Block


@dataclass(frozen=True, slots=True)
class If:
    """``if (c0) b0 else if (c1) b1 ... else orelse``"""

    branches: tuple[tuple[Expr, Block], ...]
    orelse: Block | None = None


@dataclass(frozen=True, slots=True)
class Comment:
    text: str


@dataclass(frozen=True, slots=True)
class Alloc:
    """A zeroed local array of ``count`` elements of symbolic ``type`` (a workspace)."""

    type: str
    name: str
    count: Expr
    #: allocate only when this holds (else the pointer is NULL)
    when: Expr | None = None


@dataclass(frozen=True, slots=True)
class Pointer:
    """``type* name = base + offset`` (a thread's slice of a workspace)."""

    type: str
    name: str
    base: str
    offset: Expr
    #: when ``base`` is NULL, point here instead
    fallback: str = ""


@dataclass(frozen=True, slots=True)
class Free:
    name: str


@dataclass(frozen=True, slots=True)
class Return:
    """Leave the kernel with a status (non-zero: the runtime raises)."""

    status: int
    cond: Expr


@dataclass(frozen=True, slots=True)
class Effect:
    """A call evaluated for its effect (``sort`` of a coordinate list)."""

    call: Call


@dataclass(frozen=True, slots=True)
class Block:
    body: tuple[Stmt, ...] = ()


Stmt = Decl | Assign | For | While | If | Comment | Alloc | Pointer | Free | Effect | Return | Block


# -------------------------------------------------------------------- helpers
def block(*stmts: Stmt | Block | None) -> Block:
    """A block of the given statements; nested blocks are flattened, ``None`` dropped."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Block):
            out.extend(s.body)
        else:
            out.append(s)
    return Block(tuple(out))


def conj(*terms: Expr) -> Expr:
    """Logical and of ``terms`` (``1`` when empty)."""
    if not terms:
        return IntLit(1)
    result = terms[0]
    for t in terms[1:]:
        result = Bin("&&", result, t)
    return result


def add(a: Expr, b: Expr) -> Expr:
    if isinstance(b, IntLit) and b.value == 0:
        return a
    if isinstance(a, IntLit) and a.value == 0:
        return b
    return Bin("+", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, IntLit) and a.value == 0:
        return a
    if isinstance(a, IntLit) and a.value == 1:
        return b
    return Bin("*", a, b)
