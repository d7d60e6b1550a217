"""An output's layout: which of its levels are located (a dense prefix), appended (compressed
and singleton levels, assembled by the kernel) or stored as a dense block below the last
appended level. The lowerer, the assembler, the ABI and the runtime all read it. How one
kernel assembles such an output is its `AssemblyMode`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..base.errors import FormatError
from .formats import Compressed, Dense, Format, Singleton, parse_format


@dataclass(frozen=True, slots=True)
class OutputLayout:
    """Which output levels are located (dense prefix), appended, or a dense block below."""

    fmt: Format
    #: the levels before the first compressed one (all dense)
    dense_prefix: int
    #: appended unique compressed levels, excluding the last appended group
    inner: tuple[int, ...]
    #: first level of the last appended group (a unique compressed level or COO's "u")
    last: int
    #: singleton levels stored alongside ``last`` at every entry (COO)
    tail: tuple[int, ...]
    #: dense levels below the last group: a block per entry
    block: tuple[int, ...]

    @staticmethod
    def of(fmt: Format, name: str) -> OutputLayout:
        levels = fmt.levels
        n = len(levels)
        k = 0
        while k < n and isinstance(levels[k], Dense):
            k += 1
        prefix = k
        sparse = [j for j in range(n) if not isinstance(levels[j], Dense)]
        if any(isinstance(levels[j], Dense) for j in range(prefix, (sparse[-1] if sparse else 0))):
            raise FormatError(
                f"output {name!r} ({fmt.spelling}): a dense level between sparse levels is not "
                "supported for outputs; use e.g. 'ds', 'ss', 'sss', 'ssd' or COO 'uqq'"
            )
        compressed = [j for j in sparse if isinstance(levels[j], Compressed)]
        singles = [j for j in sparse if isinstance(levels[j], Singleton)]
        if not compressed:
            # 'dq', 'ddq': singletons with no compressed level above them to append to
            first = min(singles)
            letters = "s" if first == n - 1 else "u" + "q" * (n - first - 1)
            fix = Format(levels[:first] + parse_format(letters, n - first).levels, fmt.ordering)
            raise FormatError(
                f"output {name!r} ({fmt.spelling}): a singleton output level needs a "
                "compressed level above it to append to (COO, e.g. 'uq', 'uqq'); store "
                f"{name} as '{fix}' instead"
            )
        last = compressed[-1]
        if singles and (
            levels[last].unique or singles != list(range(last + 1, last + 1 + len(singles)))
        ):
            raise FormatError(
                f"output {name!r} ({fmt.spelling}): singleton output levels must follow one "
                "non-unique compressed level at the end (COO, e.g. 'uq', 'uqq')"
            )
        block = tuple(range(sparse[-1] + 1, n))
        if block and singles:
            raise FormatError(
                f"output {name!r} ({fmt.spelling}): COO levels cannot have dense levels below"
            )
        return OutputLayout(fmt, prefix, tuple(compressed[:-1]), last, tuple(singles), block)

    @property
    def one_entry_per_step(self) -> bool:
        """The last level gets at most one entry per iteration of its loop (no COO
        singletons or dense blocks below it): the single pass checks such loops up front,
        and the runtime gives that level an extent of slack for it."""
        return not self.tail and not self.block

    @property
    def can_scatter(self) -> bool:
        """A unique compressed last level with nothing below it: its entries can go
        through a dense workspace (scattered, then appended in order; Gustavson's)."""
        return self.fmt.levels[self.last].unique and not self.block and not self.tail

    @property
    def rowwise(self) -> bool:
        """Dense levels then one compressed level (CSR, CSC, 'dds'): every row's entries
        can be counted into ``pos`` independently, prefix-summed, and filled in parallel."""
        return self.dense_prefix >= 1 and not self.inner and self.one_entry_per_step


class AssemblyMode(Enum):
    """How one kernel assembles a sparse output (`sparsec.lower.assemble.Assembler`): the
    phase it lowers and how its rows go. A caller asks for a phase (COUNT, FILL, APPEND or
    APPEND_CHUNKS); `of` makes it the layout's mode, the one place rows and chunks are
    decided."""

    #: symbolic phase: count every appended level's positions into ``sc_sizes``
    COUNT = "count"
    #: symbolic phase, rows independent: count each row's entries into its ``pos`` slot
    COUNT_ROWS = "count rows"
    #: numeric phase in one sequence: append into arrays of the counted sizes (checked)
    FILL = "fill"
    #: numeric phase, rows independent: fill each row from its prefix-summed ``pos`` slot
    FILL_ROWS = "fill rows"
    #: single pass, serial: append into arrays of a proven capacity
    APPEND = "append"
    #: single pass in chunks of rows, each appended into its own region (`lower.chunks`)
    APPEND_CHUNKS = "append chunks"

    @staticmethod
    def of(layout: OutputLayout, phase: AssemblyMode) -> AssemblyMode:
        """``phase`` for an output of ``layout``: a two-phase kernel goes row by row where
        the rows are independent (`OutputLayout.rowwise`); a single pass keeps one counter
        across rows, in chunks only where the rows are the first level."""
        rows = layout.rowwise
        if phase in (AssemblyMode.COUNT, AssemblyMode.COUNT_ROWS):
            return AssemblyMode.COUNT_ROWS if rows else AssemblyMode.COUNT
        if phase in (AssemblyMode.FILL, AssemblyMode.FILL_ROWS):
            return AssemblyMode.FILL_ROWS if rows else AssemblyMode.FILL
        chunks = phase is AssemblyMode.APPEND_CHUNKS and rows and layout.dense_prefix == 1
        return AssemblyMode.APPEND_CHUNKS if chunks else AssemblyMode.APPEND

    @property
    def counting(self) -> bool:
        """The symbolic phase: positions counted, nothing stored."""
        return self in _COUNTING

    @property
    def rowwise(self) -> bool:
        """Per-row counters, each row started at its own ``pos`` slot (no capacity checks:
        the runtime sized every row)."""
        return self in _ROWWISE

    @property
    def single_pass(self) -> bool:
        """One kernel appends without a count first: its loops check capacity up front."""
        return self in _SINGLE_PASS

    @property
    def chunked(self) -> bool:
        return self is AssemblyMode.APPEND_CHUNKS

    @property
    def checks_capacity(self) -> bool:
        """The kernel appends at one counter per level and checks each level's capacity,
        read from ``sc_sizes``."""
        return not (self.counting or self.rowwise)


_COUNTING = frozenset({AssemblyMode.COUNT, AssemblyMode.COUNT_ROWS})
_ROWWISE = frozenset({AssemblyMode.COUNT_ROWS, AssemblyMode.FILL_ROWS})
_SINGLE_PASS = frozenset({AssemblyMode.APPEND, AssemblyMode.APPEND_CHUNKS})
