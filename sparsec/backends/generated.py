"""What code generation hands the runtime: the source, its ABI, and how to launch it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..abi import Signature
from ..base.target import C, Target
from ..ir import nodes as ir
from ..middle.capacity import EntryBound
from ..middle.commands import Command
from ..middle.spec import Spec


@dataclass(frozen=True, slots=True)
class Launch:
    """How the runtime launches a CUDA kernel."""

    #: the trip count of the GPUBlock loop, as loop IR over the kernel's arguments and the
    #: declarations before that loop (``body``); None: not known before the launch
    grid: ir.Expr | None
    block: int
    #: the output must be zeroed before the launch
    zero_before: bool
    #: the lowered body (for evaluating ``grid`` on the host)
    body: ir.Block
    #: lanes of a warp exchange values (``__shfl_down_sync``): the emulation needs fibers
    shuffles: bool = False
    #: the value the output is filled with before the launch (a semiring's identity)
    fill: float = 0.0
    #: a rowwise sparse output's counting kernel (``sparsec_assemble``: each row's entries
    #: into its pos slot), launched like the fill kernel before it; None for dense outputs
    assemble: ir.Block | None = None
    #: a GPU workspace (SpGEMM): elements per thread by role (`abi.GPU_WORKSPACE`); the
    #: runtime allocates one zeroed slice per thread of the launch and passes the threads
    #: as ``sc_threads``
    scratch: tuple[tuple[str, ir.Expr], ...] = ()
    #: lanes reduce in groups smaller than a warp (the template's ``sc_group_*``)
    groups: bool = False
    #: a warp's lanes combine runs of atomic stores (the template's ``sc_segment_*``)
    segments: bool = False


@dataclass(frozen=True, slots=True)
class Generated:
    """One kernel's source and what the runtime needs to build and call it: with
    `sparsec.abi`, all the runtime knows of code generation (frozen data, picklable)."""

    source: str
    #: the ABI: every parameter, in order (`sparsec.abi`)
    signature: Signature
    #: the loops, outermost first, by index variable
    loop_order: tuple[str, ...]
    #: the schedule that ran, in words (the header's and `Kernel.schedule`)
    schedule: str
    #: the value dtype ("float32", "float64") and the index dtype ("int32", "int64")
    dtype: str
    index_dtype: str
    #: what each `bound` of the schedule promises (kernel status BOUND_VIOLATED)
    bounds: tuple[str, ...] = ()
    #: what it was generated for (`sparsec.base.target`)
    target: Target = C
    #: CUDA: grid, block and zeroing (a `Launch`)
    launch: Any = None
    #: the schedule's commands that were applied (CUDA: the default's, when chosen)
    commands: tuple[Command, ...] = ()
    #: sparse output: the function that fills the output in one serial pass, given arrays
    #: of a proven capacity ("": none; the two phases run)
    append: str = ""
    #: a 16-bit kernel that adds into its output (sums, atomics): the output's values are
    #: float32 (``sc_acc_t``), so that its sums accumulate in float32, and the runtime
    #: rounds them to 16 bits after the kernel
    wide_output: bool = False
    #: ``append`` runs in chunks of rows (`sparsec.lower.chunks`): it reads the chunk
    #: table after the output's sizes in ``sc_sizes``
    chunked: bool = False
    #: the extent parameters whose register-tile stages are built for one extent when the
    #: build names it (`sparsec.passes.stages`; the source's ``SC_HINT_`` macros)
    tile_extents: tuple[str, ...] = ()
    #: whether the C source also defines ``sparsec_kernel_packed`` (its arguments in one
    #: int64 array; none where a parameter is a scalar value)
    packed: bool = False
    #: a sparse output's entry bound (`sparsec.middle.capacity.entry_bound_of`), which the runtime
    #: counts on a call's inputs for the single pass's capacities and chunks; None: none
    bound: EntryBound | None = None
    #: CUDA: the spec the kernel computes where the output is computed as rows into its
    #: rowwise staging output (`sparsec.middle.staging.staged`), which the runtime
    #: compacts into the asked-for one; None: the output as asked
    staging: Spec | None = None
    #: CUDA: the emulation's launchers (`sparsec.backends.cuda.launchers`), printed after
    #: the source when the runtime builds it behind the shim (``target="cuda-emulated"``)
    launchers: str = ""
    #: C: the unit is built with its floating-point sums reassociable
    #: (`PassOptions.reassociate`; `sparsec.runtime.build.REASSOCIATE_FLAGS`)
    reassociate: bool = False
    #: C: the output rows each register tile holds together (`passes.tile`; a bsr
    #: block's), the fewest over the kernel's tiles: a vector gathered from a dense operand
    #: serves that many (`policy.costs.misaligned` weighs the gathers by it)
    shared_rows: int = 1
