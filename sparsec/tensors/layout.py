"""An output's layout: which of its levels are located (a dense prefix), appended (compressed
and singleton levels, assembled by the kernel) or stored as a dense block below the last
appended level. The lowerer, the assembler, the ABI and the runtime all read it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FormatError
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
