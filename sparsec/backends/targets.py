"""The languages the printer prints (`C`, `CUDA`: one `Dialect` each, chosen by
`sparsec.base.target.Target.language`), as data: type spellings, the restrict keyword,
operator, intrinsic and function spellings, how parallel loops and atomics are written,
the translation unit's template with its value, accumulator and index types; and how a
16-bit kernel's values are typed (`storage_arrays`, `adds_into_output`, `param`). What a
target can do is `sparsec.base.target`'s; how it is spelled is here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..abi import INT, Param, Signature
from ..base.values import INTEGRAL, TYPES
from ..ir import nodes as ir
from ..middle.commands import Unit
from ..policy.compiler import C_HALF_TYPES
from .generated import Generated

#: the value a semiring's add (`lower.semiring`) stores, ``op`` -> expression
SEMIRING_VALUES = {
    "min=": "sc_vmin({target}, {value})",
    "max=": "sc_vmax({target}, {value})",
    "or=": "{target} || ({value})",
}
#: the accumulating updates of a semiring's add, ``op`` -> statement
SEMIRING_UPDATES = {op: f"{{target}} = {e};" for op, e in SEMIRING_VALUES.items()}

#: intrinsic spellings: the templates define each ``sc_*`` helper (C and CUDA alike)
CALLS = {
    name: f"sc_{name}"
    for name in (
        "min",
        "max",
        "vmin",
        "vmax",
        "vdiv",
        "pair",
        "second",
        "sort_reached",
        "mark",
        "mark_bits",
        "count_reached",
        "hash_add_key",
        "hash_slot",
        "hash_sort",
        "bit_test",
        "bit_set",
        "bit_clear",
        "thread_id",
        "search",
        "gallop",
        "gallop_row",
        "warp_sum",
        "group_sum",
        "group_min",
        "group_max",
        "group_or",
        "group_lane",
        "segment_sum",
        "segment_head",
        "warp_min",
        "warp_max",
        "warp_or",
        "lane",
        "block_threads",
        "thread_in_block",
        "vload",
        "vstore",
        "vstore_out",
        "rows_aligned",
        "store_fence",
        "vzero",
        "prefetch",
        "prefetch_row",
        "prefetch_stream",
        "stage",
        "stages_missing",
    )
}

#: the functions of the language that are calls (``fn_sqrt``, as the lowerer emits them;
#: it builds ``relu``, ``sign`` and ``sigmoid`` from others), spelled per dialect: GCC/Clang
#: builtins in C (no ``<math.h>`` needed; computed in double, as float32 sums are), the
#: CUDA math API's overloads on CUDA (float or double by the operand's type)
C_FUNCTIONS = {
    "fn_abs": "__builtin_fabs",
    "fn_sqrt": "__builtin_sqrt",
    "fn_exp": "__builtin_exp",
    "fn_log": "__builtin_log",
    "fn_sin": "__builtin_sin",
    "fn_cos": "__builtin_cos",
    "fn_tanh": "__builtin_tanh",
    "fn_max": "__builtin_fmax",
    "fn_min": "__builtin_fmin",
    "fn_pow": "__builtin_pow",
}
CUDA_FUNCTIONS = {
    "fn_abs": "fabs",
    "fn_sqrt": "sqrt",
    "fn_exp": "exp",
    "fn_log": "log",
    "fn_sin": "sin",
    "fn_cos": "cos",
    "fn_tanh": "tanh",
    "fn_max": "fmax",
    "fn_min": "fmin",
    "fn_pow": "pow",
}

#: the loop IR's types that both targets spell alike (the template typedefs the value,
#: accumulator and index types per kernel)
_SHARED_TYPES = {
    ir.VAL: "sc_val_t",
    ir.ACC: "sc_acc_t",
    ir.IDX: "sc_idx_t",
    ir.BOOL: "int",
    INT: "int",
}

#: an integral kernel's spellings of the functions it has (the templates define each)
INTEGRAL_FUNCTIONS = {"fn_abs": "sc_iabs", "fn_max": "sc_imax", "fn_min": "sc_imin"}
#: the 16-bit value dtypes: stored in 16 bits, loaded with ``sc_ld`` into the accumulator
#: type (float), which every local, literal and sum uses, and stored back with ``sc_st``
#: (round to nearest even); the templates define both per dtype
HALF_DTYPES = ("float16", "bfloat16")

#: (first index, stride) of each GPU unit's grid/block/warp-strided loop; "lane" is a
#: GPUThread loop inside a warp (of 32 lanes)
GPU_STRIDES = {
    Unit.GPUBlock: ("(long long)blockIdx.x", "(long long)gridDim.x"),
    Unit.GPUWarp: ("(long long)(threadIdx.x >> 5)", "(long long)(blockDim.x >> 5)"),
    Unit.GPUThread: ("(long long)threadIdx.x", "(long long)blockDim.x"),
    "lane": ("(long long)(threadIdx.x & 31)", "32"),
}


def cuda_strides(par: ir.Parallel) -> tuple[str, str] | None:
    """(first index, stride) of a CUDA loop on a GPU unit (None: no such unit): strided
    over the grid, the warps of a block, its threads, a warp's 32 lanes, the warp's groups
    of ``par.lanes`` lanes, or one group's lanes."""
    key = "lane" if par.schedule in ("lane", "group") else par.unit
    if key not in GPU_STRIDES:
        return None
    if par.schedule == "group":  # the warp's groups of par.lanes lanes
        shift = par.lanes.bit_length() - 1
        return f"(long long)((threadIdx.x & 31) >> {shift})", str(32 // par.lanes)
    if par.lanes != 32:  # a group's lanes
        return f"(long long)(threadIdx.x & {par.lanes - 1})", str(par.lanes)
    return GPU_STRIDES[key]


@dataclass(frozen=True)
class Dialect:
    """Everything the printer does differently per language, as data: type spellings,
    the restrict keyword, how a loop is unrolled, how a parallel loop runs (OpenMP pragmas
    on CPU units, loops strided over the launch on GPU units) and how an atomic update is
    written."""

    name: str
    types: Mapping[str, str]
    restrict: str
    #: the pragma asking the compiler to unroll a loop ``{}`` times
    unroll: str
    #: the lines of an atomic ``{target} {op} {value}``
    atomic_lines: tuple[str, ...]
    #: `atomic_lines` for an integral kernel's values (empty: the same)
    integral_atomic_lines: tuple[str, ...] = ()
    #: the update operators an atomic may use (empty: any)
    atomic_ops: tuple[str, ...] = ()
    #: the lines of an atomic semiring update (``min=``, ``max=``, ``or=``), which no
    #: instruction does for floating point: ``{target}``, ``{value}`` as in `atomic_lines`
    semiring_atomics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: whether an atomic update may target a local variable (OpenMP: a shared local; CUDA
    #: atomics need global or shared memory)
    atomic_locals: bool = True
    #: parallel loops on CPU units become OpenMP pragmas
    openmp: bool = False
    #: a GPU unit's loop strided over the launch: (first index, stride) for its
    #: `ir.Parallel`, None where the dialect has no such unit (`cuda_strides`)
    strides: Callable[[ir.Parallel], tuple[str, str] | None] | None = None
    calls: Mapping[str, str] = field(default_factory=lambda: CALLS)
    indent: str = "  "
    #: the translation unit's skeleton (in ``templates/``)
    template: str = ""
    #: dtype -> the value type (``ir.VAL``); a 16-bit dtype's is in `half_types`
    value_types: Mapping[str, str] = field(default_factory=dict)
    #: dtype -> the type reductions accumulate in (``ir.ACC``)
    acc_types: Mapping[str, str] = field(default_factory=dict)
    #: index dtype -> the index type (``ir.IDX``)
    index_types: Mapping[str, str] = field(default_factory=dict)
    #: a 16-bit dtype -> the type its values are stored in (see `HALF_DTYPES`)
    half_types: Mapping[str, str] = field(default_factory=dict)

    def param(self, p: Param, half: bool = False, wide: bool = False) -> str:
        """``p``'s declaration; ``half``: a 16-bit kernel's (scalar values are floats),
        ``wide``: ``p`` holds float values under it (`Generated.wide_output`)."""
        ty = "sc_acc_t" if (wide or (half and p.kind == "value")) and p.type == ir.VAL else None
        ty = ty or self.types[p.type]
        if p.kind == "value":
            return f"{ty} {p.name}"
        const = "" if p.writable else "const "
        return f"{const}{ty}* {self.restrict} {p.name}"

    def openmp_pragma(self, par: ir.Parallel, threads: str) -> str:
        reduce = f" reduction(+:{', '.join(par.reduction)})" if par.reduction else ""
        if par.flags:
            reduce += f" reduction(max:{', '.join(par.flags)})"
        match par.unit:
            case Unit.CPUThread:
                sched = par.schedule + (f", {par.chunk}" if par.chunk else "")
                collapse = f" collapse({par.collapse})" if par.collapse > 1 else ""
                cond = f"{threads} > 1" + (f" && {par.only_if}" if par.only_if else "")
                return (
                    f"#pragma omp parallel for schedule({sched}){collapse} num_threads({threads}) "
                    f"if({cond}){reduce}"
                )
            case Unit.CPUVector:
                return f"#pragma omp simd{reduce}"
            case _:
                raise ValueError(f"target {self.name} cannot run {par.unit} loops")

    def atomic(self, lhs: str, op: str, value: str, integral: bool = False) -> list[str]:
        """The lines of the atomic update ``lhs op value`` (``lhs``: a C lvalue) of a
        kernel's values (``integral``: of an integral type)."""
        if self.atomic_ops and op not in self.atomic_ops:
            raise ValueError(f"no atomic {op!r} on {self.name}")
        lines = (integral and self.integral_atomic_lines) or self.atomic_lines
        return [line.format(target=lhs, op=op, value=value) for line in lines]

    def loop_head(
        self, var: str, start: str, end: str, par: ir.Parallel | None, unroll: int, threads: str
    ) -> list[str]:
        """The lines that open ``for var in [start, end)``: a CPU unit's pragma before the
        loop, a GPU unit's loop strided from this thread's first index."""
        head = [self.openmp_pragma(par, threads)] if par is not None and self.openmp else []
        if unroll:
            head.append(self.unroll.format(unroll))
        i64 = self.types[ir.I64]
        if par is None or self.openmp:
            head.append(f"for ({i64} {var} = {start}; {var} < {end}; {var}++) {{")
            return head
        strided = self.strides(par) if self.strides is not None else None
        if strided is None:
            raise ValueError(f"target {self.name} cannot run {par.unit} loops")
        first, stride = strided
        init = first if start == "0" else f"{start} + {first}"
        head.append(f"for ({i64} {var} = {init}; {var} < {end}; {var} += {stride}) {{")
        return head


C = Dialect(
    name="c",
    types={
        **_SHARED_TYPES,
        ir.I64: "int64_t",
        ir.U64: "uint64_t",
        ir.U8: "uint8_t",
        ir.VEC: "sc_vec_t",
    },
    restrict="restrict",
    unroll="#pragma GCC unroll {}",
    atomic_lines=("#pragma omp atomic", "{target} {op} {value};"),
    # one thread at a time (OpenMP's atomics update only with arithmetic operators)
    semiring_atomics={
        op: ("#pragma omp critical(sc_semiring)", line) for op, line in SEMIRING_UPDATES.items()
    },
    openmp=True,
    calls={**CALLS, **C_FUNCTIONS},
    template="kernel.c.j2",
    value_types={name: t.c for name, t in TYPES.items() if t.c},
    # float32 sums in double: as fast as summing in float (the conversion is off the add
    # chain) and exact far longer (docs/decisions.md, "float32 sums accumulate in double")
    acc_types={
        "float32": "double",
        "float64": "double",
        "float16": "float",
        "bfloat16": "float",
        # an integral kernel computes in its own type: every operation wraps, as numpy's
        **{name: TYPES[name].c for name in INTEGRAL},
    },
    index_types={"int32": "int32_t", "int64": "int64_t"},
    # the compiler's own types where it has them (`policy.machine.c_half_types`)
    half_types=C_HALF_TYPES,
)

#: CUDA: GPU loops are strided over the grid, the warps of a block, its threads or a
#: warp's lanes (correct for any launch size); stores shared by threads use atomicAdd
CUDA = Dialect(
    name="cuda",
    types={
        **_SHARED_TYPES,
        ir.I64: "long long",
        ir.U64: "unsigned long long",
        ir.U8: "unsigned char",
    },
    restrict="__restrict__",
    unroll="#pragma unroll {}",
    atomic_lines=("atomicAdd(&{target}, {value});",),
    # no atomicAdd takes 8- or 16-bit values: the template's compare-and-swap loop
    integral_atomic_lines=("sc_add_atomic(&{target}, {value});",),
    atomic_ops=("+=",),
    # compare-and-swap loops of the template (``kernel.cu.j2``; the emulation's shim too)
    semiring_atomics={
        "min=": ("sc_atomic_min(&{target}, {value});",),
        "max=": ("sc_atomic_max(&{target}, {value});",),
        "or=": ("sc_atomic_or(&{target}, {value});",),
    },
    atomic_locals=False,
    strides=cuda_strides,
    calls={**CALLS, **CUDA_FUNCTIONS},
    template="kernel.cu.j2",
    value_types={name: t.cuda for name, t in TYPES.items() if t.cuda},
    # the value type: unlike the C target's, since most GPUs run double arithmetic at 1/32
    # to 1/64 of the float rate, which would make float32 SpMM several times slower; sums
    # across a GPU mapping's threads are also split into shorter per-thread parts
    acc_types={
        "float32": "float",
        "float64": "double",
        "float16": "float",
        "bfloat16": "float",
        **{name: TYPES[name].cuda for name in INTEGRAL},
    },
    index_types={"int32": "int", "int64": "long long"},
    # the bits, converted by the template's sc_ld/sc_st (NVRTC has no cuda_fp16.h built in)
    half_types={"float16": "unsigned short", "bfloat16": "unsigned short"},
)


#: the dialects by language (`sparsec.base.target.Target.language`)
DIALECTS = {d.name: d for d in (C, CUDA)}


def param(target: Dialect, p: Param, gen: Generated) -> str:
    """``p``'s declaration in ``gen``'s kernel on ``target``: under a 16-bit dtype, a GPU
    workspace's values (SpGEMM's rows, `abi.GPU_WORKSPACE`) and an output added into are
    float, as `storage_arrays` leaves them out."""
    half = gen.dtype in HALF_DTYPES
    wide = half and (
        p.field in ("ws_vals", "ws_hvals")
        or (gen.wide_output and p.name == _output_vals(gen.signature))
    )
    return target.param(p, half, wide)


def _output_vals(sig: Signature) -> str:
    return sig.array(sig.params[0].tensor or "", "vals")


def adds_into_output(dtype: str, sig: Signature, *bodies: ir.Block) -> bool:
    """Whether a 16-bit kernel updates its output's values other than by plain stores
    (then they are float: `Generated.wide_output`)."""
    if dtype not in HALF_DTYPES:
        return False
    out = _output_vals(sig)
    return any(
        isinstance(s, ir.Assign)
        and isinstance(s.target, ir.Load)
        and s.target.array == out
        and (s.op != "=" or s.atomic)
        for b in bodies
        for s in _statements(b)
    )


def storage_arrays(
    dtype: str, sig: Signature, *bodies: ir.Block, wide: bool = False
) -> frozenset[str]:
    """The arrays of 16-bit values under ``dtype`` (none for float32/float64): the tensors'
    ``vals`` (the output's unless ``wide``), and a workspace whose pointer falls back to one
    of them (a thread's copy of the output, `lower.parallel`), so both are read alike."""
    if dtype not in HALF_DTYPES:
        return frozenset()
    found = {p.name for p in sig.params if p.field == "vals"} - (
        {_output_vals(sig)} if wide else set()
    )
    pointers = [s for b in bodies for s in _statements(b) if isinstance(s, ir.Pointer)]
    for s in pointers:
        if s.fallback in found:
            found |= {s.name, s.base}
    return frozenset(found)


def _statements(node: ir.Stmt) -> list[ir.Stmt]:
    """``node`` and every statement nested in it."""
    match node:
        case ir.Block(body=body):
            return [x for s in body for x in _statements(s)]
        case ir.For(body=body) | ir.While(body=body):
            return [node, *_statements(body)]
        case ir.If(branches=branches, orelse=orelse):
            inner = [x for _, b in branches for x in _statements(b)]
            return [node, *inner, *(_statements(orelse) if orelse is not None else [])]
        case _:
            return [node]
