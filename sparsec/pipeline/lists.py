"""Each target's passes, in order, and each pass called in the pass protocol (`passes.protocol`):
what it reads of the `PassInput` and the name its notes go under."""

from __future__ import annotations

from dataclasses import replace

from ..abi import Signature
from ..ir import nodes as ir
from ..middle.spec import Spec
from ..passes.bands import Walks, band
from ..passes.coarsen import coarsen
from ..passes.dots import vectorize_dots
from ..passes.jam import jam
from ..passes.protocol import Pass, Passed, PassInput
from ..passes.stream_output import stream_output
from ..passes.streams import prefetch_streams
from ..passes.tile import tile


def _streams(p: Passed, unit: PassInput) -> Passed:
    return p.after("streams", *prefetch_streams(p.body, unit.options))


def _tile(p: Passed, unit: PassInput) -> Passed:
    extents = {crd: extent for crd, (_, extent) in _walks(unit.spec, unit.sig).items()}
    held: list[int] = []
    done = p.after("tile", *tile(p.body, unit.options.tile, extents, held))
    return replace(done, rows=min(held, default=1))


def _jam(p: Passed, unit: PassInput) -> Passed:
    return p.after("jam", *jam(p.body, unit.options))


def _bands(p: Passed, unit: PassInput) -> Passed:
    body, notes, params = band(p.body, _walks(unit.spec, unit.sig))
    return replace(p.after("bands", body, notes), params=params)


def _walks(spec: Spec, sig: Signature) -> Walks:
    """Each compressed input level's ``crd`` array -> (its ``pos`` array, the level's
    extent), for depth blocks; a level whose tensor is read at more than one index there
    is left out (its extent is not one index's)."""
    found: dict[str, tuple[str, ir.Expr]] = {}
    for p in sig.params:
        if p.field != "crd" or p.tensor is None or p.tensor == spec.output.name:
            continue
        t = spec.tensor(p.tensor)
        mode = t.format.ordering[p.level]
        indices = {a.indices[mode] for a in spec.assignment.accesses() if a.name == t.name}
        try:
            pos = sig.array(t.name, "pos", p.level)
        except KeyError:
            continue  # a singleton level: no segments
        if len(indices) == 1:
            found[p.name] = (pos, sig.extent(indices.pop()))
    return found


def _dots(p: Passed, unit: PassInput) -> Passed:
    return p.after("dots", *vectorize_dots(p.body, unit.options))


def _coarsen(p: Passed, unit: PassInput) -> Passed:
    return p.after("coarsen", *coarsen(p.body, unit.options))


#: the C kernel's passes, in order. Streams first: a loop that the tile pass will tile
#: nests the tiled loop, so it is no stream loop, and a stream loop's prefetches never sit
#: inside a region to be tiled. Column bands reorder the tiled parallel loop; the output
#: tiles are streamed once their loops are final; dot loops (innermost, serial, untiled;
#: the jammed ones included) go on vector lanes last, so no other pass meets their blocks
C_PASSES: tuple[Pass, ...] = (_streams, _tile, _jam, _bands, stream_output, _dots)
#: a sparse output's single-pass append function: serial, so no bands
C_APPEND_PASSES: tuple[Pass, ...] = (_streams, _tile, _jam, _dots)


#: the CUDA kernel's passes (the decision runs them on a default GPU mapping only)
CUDA_PASSES: tuple[Pass, ...] = (_coarsen,)
