"""Lowering: a concrete statement and its schedule (`middle.schedule`) to the loop IR of
one kernel.

Other stages import from this package, not from its modules. Read it module by module,
top to bottom: `kernel` (the entry and the one epilogue), `lowerer` (the recursion),
`coiterate` (loops over a lattice), `spaces` (the schedule's split/pos/fuse loops),
`where` (precompute), `parallel` (how a loop runs: CPU threads and vectors, private
copies), `gpu` (GPU loops), `races` (the race analysis), `output` (stores),
`levels` (level functions on an access), `env` and `ctx` (the state), `assemble`,
`workspace` and `chunks` (sparse outputs).
"""

from .chunks import wrap as wrap_chunks
from .entry import LoweredKernel, lower, names_for

__all__ = [
    "LoweredKernel",
    "lower",
    "names_for",
    "wrap_chunks",
]
