"""One typed decision per kernel: everything a kernel's code depends on besides its
statement and formats, decided here from the user's schedule, the target and the dtype.

`decide` holds the hand-coded defaults (each tuned on one machine: docs/decisions.md); the
pipeline applies a `Decision` as given, the passes take their options from it, and
``schedule="auto"`` searches values of it (`policy.tuning.candidates` replaces fields of
the default). A field is a value the runtime cannot change after generation, so host
calibration or the tuner sets it by building another `Decision`, never by a module constant.

Where a choice needs a lowering's result (whether the count loops or allocates), the field
states the rule (`Output.BY_COUNT`) and the pipeline resolves it with `Decision.output_for`;
the decision never pretends to know the lowering in advance.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ..base.target import Target
from ..middle.commands import Command
from ..middle.spec import Spec
from . import calibrated
from .machine import machine

#: a parallel CPU loop's dynamic schedule: about this many chunks per thread, so skewed
#: rows balance
CHUNKS_PER_THREAD = 8


class Output(Enum):
    """How a sparse output is assembled (a dense output is written in place: `DENSE`)."""

    DENSE = "dense"
    #: the symbolic phase counts, the runtime allocates, the numeric phase fills (where
    #: rows are not filled row by row, the serial kernel appends into large enough arrays)
    TWO_PHASES = "two phases"
    #: one serial pass appending into a capacity the runtime proved
    SINGLE_PASS = "single pass"
    #: the single pass in chunks of rows on threads (the serial pass where rows do not
    #: fall into one plain loop or carry state from row to row)
    SINGLE_PASS_CHUNKS = "single pass in chunks"
    #: the rule, resolved once the count is lowered (`Decision.output_for`): one pass where
    #: a count costs what a fill does (the count loops or allocates: a merge, a workspace)
    #: or rows fill serially anyway (not rowwise), in chunks where threads are allowed and
    #: the count is heavy; else two phases. A single pass that visits rows out of storage
    #: order is refused by its schedule, and the kernel takes two phases (measured:
    #: docs/decisions.md, "Sparse outputs: one pass into a proven capacity")
    BY_COUNT = "by the count"


@dataclass(frozen=True, slots=True)
class TileOptions:
    """Register tiles (`passes.tile`): whole tiles of ``vectors`` vectors (8 AVX2
    registers of the 16, leaving room for loads and the broadcast factor; FMA latency ×
    issue width is also about 8 on current x86 cores), then one tile each of half as many,
    down to ``narrowest`` vectors (tiles of one vector, a pass over the region per vector,
    measured no faster than the plain loop); a gathered row is prefetched
    ``prefetch_distance`` iterations ahead (`passes.gathers`: enough to hide an L2 miss at
    a few cycles per vector FMA; 2 to 12 measured alike on Zen, 6 is in the middle; 0 for no
    prefetch, which host calibration may choose)."""

    vectors: int = 8
    narrowest: int = 2
    prefetch_distance: int = 6
    #: the most rows of a loop fixed in the code (a bsr block's) that a tile holds together,
    #: each in ``row_accumulators // rows`` vectors
    rows: int = 4
    #: the vector accumulators of a tile holding rows together: ``vectors``' 8 of AVX2's
    #: 16 registers; `defaults` gives 16 where the registers are 32 (64-byte vectors,
    #: AVX-512), which the rows' shared loads leave room for (docs/decisions.md, "A bsr
    #: block's rows share their register tiles")
    row_accumulators: int = 8


@dataclass(frozen=True, slots=True)
class PassOptions:
    """Which passes run (by name, in the pipeline's order for the target) and each tuned
    option of theirs.

    ``stream_distance``: positions ahead of a stream loop's start that each stream is
    prefetched (`passes.streams`; 64 to 320 measured alike); ``stream_locality``: those
    prefetches' locality hint, 0 (non-temporal, ``prefetchnta``) to 3 (every cache level,
    ``prefetcht0``), None for no stream prefetch. The default, 3, is safe on both CPU
    families measured: non-temporal prefetches cost an Intel server SpMV 2.4x, and hint 3
    matched no prefetch there; on Zen the three measured alike (docs/decisions.md, "Stream
    loops prefetch their crd and vals"). Host calibration (`policy.calibration`) picks it
    per CPU. ``stream_lines``: the cache lines each such prefetch covers, 2 (a row of 10
    doubles spans two; one was slower on Zen) or 1 (fewer instructions in a loop whose
    gathers hit the core's cache: faster on an Intel server), calibrated per host.
    ``reassociate``: the C compiler may reorder the kernel's floating-point sums (the
    unit is built with associative math, `runtime.build.REASSOCIATE_FLAGS`), which lets it
    sum a row of gathers in vector lanes as TACO's -ffast-math build does (faster on rows
    of 10, slower on rows of one or two); off by default (results then
    round as the sequential order does), calibrated per host. ``jam_ways``: outer iterations
    interleaved (`passes.jam`: enough chains to cover an addition's latency at two per
    cycle without running out of registers). ``dot_block``: iterations summed into one
    value-typed partial (`passes.dots`); ``dot_fixed``: a dot loop of at most this many
    iterations known when the kernel is generated (a block's row of a mapped format) is
    left to the C compiler, which unrolls it (blocks of lanes wider than the loop would
    never run their vector loop: 4 float32 iterations at 8 lanes). ``outline``: where the kernel's
    parallel loop runs its rows in a function of their own, which keeps the parameters'
    ``restrict`` that GCC's OpenMP outlining drops (`lower.outline`): ``"fixed"`` in kernels
    whose formats fix loop extents, ``"all"`` in every kernel, ``"off"`` in none (the last
    two for comparisons, `bench.outline`).
    ``coarsen_factors``, ``coarsen_block``: columns per
    GPU thread in the first sweeps, then the next, then 1, and threads per block
    (`passes.coarsen`; 4 beat 1, 2 and 8 on an H100 on pruned-BERT SpMM)."""

    run: frozenset[str] = frozenset()
    tile: TileOptions = field(default_factory=TileOptions)
    stream_distance: int = 128
    stream_locality: int | None = 3
    stream_lines: int = 2
    reassociate: bool = False
    jam_ways: int = 4
    dot_block: int = 256
    dot_fixed: int = 16
    outline: str = "fixed"
    coarsen_factors: tuple[int, ...] = (4, 2)
    coarsen_block: int = 128

    def runs(self, name: str) -> bool:
        return name in self.run


#: the C kernel's passes by name (the pipeline orders them); 16-bit values run none (they
#: are computed in float: the passes' vector tiles would compute in them)
C_PASSES = frozenset({"streams", "tile", "jam", "bands", "stream_output", "dots"})
#: a default GPU mapping's passes (an explicit schedule is printed as written)
CUDA_PASSES = frozenset({"coarsen"})
#: the passes' options, read by `decide` at each call (so a calibration or a test sets them)
DEFAULTS = PassOptions()


def with_options(options: PassOptions, changes: dict[str, Any]) -> PassOptions:
    """``options`` with ``changes`` (field -> value; ``tile.`` names a `TileOptions` field),
    as host calibration (`policy.calibrated`) and the tuner's candidates state them."""
    tile = {k.removeprefix("tile."): v for k, v in changes.items() if k.startswith("tile.")}
    own = {k: v for k, v in changes.items() if not k.startswith("tile.")}
    return replace(options, tile=replace(options.tile, **tile), **own)


def option_of(options: PassOptions, name: str) -> Any:
    """The value of the option ``name`` in ``options`` (`with_options`'s names)."""
    if name.startswith("tile."):
        return getattr(options.tile, name.removeprefix("tile."))
    return getattr(options, name)


def defaults() -> PassOptions:
    """`DEFAULTS` for the machine's facts (`machine`): the registers a tile of held rows
    may fill, 16 accumulators where its vectors are 64 bytes (x86's 32 registers with
    AVX-512)."""
    if machine().vector_bytes >= 64:
        return with_options(DEFAULTS, {"tile.row_accumulators": 16})
    return DEFAULTS


def host_options() -> PassOptions:
    """The machine's `defaults` with the host's calibrated choices (none where calibration
    is off or not stored: `policy.calibrated`)."""
    found = calibrated.pass_options()
    base = defaults()
    return with_options(base, found) if found else base


@dataclass(frozen=True, slots=True)
class Prepare:
    """What the API does to a kernel's inputs before generating it (`Kernel.__init__`):
    ``relayout``: where no loop order fits, read the cheapest re-layout of an input
    (`middle.derive`'s refusals stand otherwise); ``regroup``: dense factors over fewer
    variables combined once a call; ``contiguous``: a dense read the innermost loop strides
    transposed. Repeated indices always read derived inputs."""

    relayout: bool
    regroup: bool
    contiguous: bool


def prepare(commands: tuple[Command, ...], target: Target) -> Prepare:
    """The inputs' preparation: none under a user's schedule (its refusals stand); the
    transposed copy on a CPU target only."""
    free = not commands
    return Prepare(relayout=free, regroup=free, contiguous=free and not target.gpu)


@dataclass(frozen=True, slots=True)
class Decision:
    """Everything decided for one kernel (see the module's docstring).

    ``commands``: the user's (or a tuning candidate's); ``parallel``: threads allowed;
    ``default_commands``: the CPU default's commands (`policy.schedules.cpu_default`) are
    appended to them; ``chunks_per_thread``: a parallel CPU loop's dynamic chunks per
    thread (`lower.parallel`)."""

    commands: tuple[Command, ...]
    parallel: bool
    default_commands: bool
    prepare: Prepare
    output: Output
    passes: PassOptions
    chunks_per_thread: int = CHUNKS_PER_THREAD
    #: the pass options a tuning candidate changed (`with_options`'s names and values), so
    #: its label names them
    tuned: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str | None:
        """The decision's name where the tuner stores it: its commands as written, then
        ``with`` and each tuned option (``with stream_locality=None``); None for the
        default."""
        said = ", ".join(map(str, self.commands))
        if self.tuned:
            options = ", ".join(f"{k}={v!r}" for k, v in self.tuned)
            said = f"{said} with {options}" if said else f"with {options}"
        return said or None

    def tuning(self, **changes: Any) -> Decision:
        """This decision with the pass options ``changes`` (``tile_`` for `TileOptions`'
        fields: ``tile_prefetch_distance=0``), named in its label."""
        named = {k.replace("tile_", "tile.", 1): v for k, v in changes.items()}
        passes = with_options(self.passes, named)
        return replace(self, passes=passes, tuned=(*self.tuned, *named.items()))

    def under(self, commands: tuple[Command, ...]) -> Decision:
        """This C decision under ``commands`` instead (a tuning candidate's), as `decide`
        makes one under a user's schedule: the CPU default's commands only where none
        parallelizes a loop, and a sparse output's rule replaced by two phases."""
        output = Output.TWO_PHASES if commands and self.output is Output.BY_COUNT else self.output
        default = self.parallel and not _parallelizes(commands)
        return replace(self, commands=commands, default_commands=default, output=output)

    def output_for(self, heavy: bool, rowwise: bool) -> Output:
        """`output` with `Output.BY_COUNT` resolved: ``heavy``, the count loops or
        allocates; ``rowwise``, the output is filled row by row."""
        if self.output is not Output.BY_COUNT:
            return self.output
        if rowwise and not heavy:
            return Output.TWO_PHASES
        return Output.SINGLE_PASS_CHUNKS if self.parallel and heavy else Output.SINGLE_PASS


def decide(
    spec: Spec,
    target: Target,
    *,
    commands: tuple[Command, ...] = (),
    parallel: bool = True,
    dtype: str = "float64",
) -> Decision:
    """The default decision for a kernel on ``target`` under the user's ``commands`` (with
    threads unless ``parallel`` is off) for ``dtype`` values. A user's schedule keeps two
    phases and, on the GPU, is printed with no pass."""
    if not target.gpu:
        # the passes' register tiles, streams and dot products are built for float32 and
        # float64 values (16-bit and integral kernels run the lowering as it is)
        run = C_PASSES if dtype in ("float32", "float64") else frozenset()
        default = parallel and not _parallelizes(commands)
    else:
        run, default = (frozenset() if commands else CUDA_PASSES), False
    if spec.output.is_dense:
        output = Output.DENSE
    else:
        output = Output.TWO_PHASES if commands or target.gpu else Output.BY_COUNT
    return Decision(
        commands,
        parallel or target.gpu,
        default,
        prepare(commands, target),
        output,
        replace(host_options() if not target.gpu else DEFAULTS, run=run),
    )


def _parallelizes(commands: tuple[Command, ...]) -> bool:
    return any(c.name == "parallelize" for c in commands)
