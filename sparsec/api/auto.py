"""``formats="auto"``: each sparse matrix's format chosen from the data at its first call.

``sparsec.kernel(expr, formats="auto")`` makes the widest input auto (the rest dense, as
with no formats); ``{"A": "auto", ...}`` names the auto inputs beside formats given. An
`AutoKernel` compiles nothing until a call shows it the data. Then, per auto input:

1. `policy.formats.Shape.of` reads its entries once and `policy.formats.candidates` ranks
   the formats that can hold it (csr, dcsr, bsr(R,C)) by the bytes a pass would read;
2. each candidate's kernel (through `sparsec.kernel`'s memo) runs the call on the input
   converted to it, and is timed in `ROUNDS` interleaved rounds of at least `ROUND_S`
   each; the fastest median wins (of those within `TIE` of it, the fewest modelled
   bytes), where it beats CSR's by `MARGIN` (a candidate the statement's rules refuse,
   `FormatError`, is skipped);
3. the choice and the converted tensor are kept for that input object (the last `KEEP`
   inputs; a `sparsec.Tensor` or a scipy matrix is immutable to sparsec, so the same
   object is the same data), so the next call with it converts and decides nothing.

`AutoKernel.formats` and `AutoKernel.choices` say what was chosen and why (the candidates'
modelled bytes and measured medians); `source` is the chosen kernel's, headed by a line
that says it was chosen. Inputs that are not matrices get the default sparse format.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..base.errors import FormatError, InputError
from ..policy.formats import Shape, candidates
from ..tensors.formats import default_sparse
from ..tensors.mapped import MappedTensor
from ..tensors.tensor import Tensor, as_tensor

#: timed rounds per candidate, candidates interleaved; each round calls a candidate once
#: untimed (its operands back in cache after the others'), then until `ROUND_S` has passed
#: (at least once, at most `ROUND_CALLS` times): the median of the rounds' per-call means
#: is its time. A round is long enough for a candidate to run as repeated calls run, its
#: operands as warm in the shared cache as they stay from call to call: rounds of a few
#: milliseconds ran a millisecond-long SpMV once each, just after the other candidates',
#: colder than any repeated call runs, and the candidates' differences shrank into the
#: noise (docs/decisions.md, "`formats="auto"` ranks by bytes")
ROUNDS = 3
ROUND_S = 20e-3
ROUND_CALLS = 100
#: a format other than CSR is chosen only when it beats CSR's median by this fraction
#: (as schedule="auto" keeps the default unless a candidate beats it clearly): two formats
#: within the noise of a shared machine are not worth a conversion. Above the rounds'
#: noise (about `TIE`), below what a choice may lose (issue 39: within 0.95x of the best)
MARGIN = 0.03
#: candidates whose medians are within this fraction of the fastest's are told apart by
#: the model, fewest bytes first: interleaved medians on a shared machine differ by about
#: this much between runs
TIE = 0.02
#: inputs whose choices are kept
KEEP = 8


def wants_auto(formats: Any) -> bool:
    """Whether a ``formats=`` argument asks for a choice from the data."""
    if isinstance(formats, str):
        return formats.strip().lower() == "auto"
    if isinstance(formats, Mapping):
        return any(isinstance(f, str) and f.strip().lower() == "auto" for f in formats.values())
    return False


class AutoKernel:
    """A kernel whose auto inputs' formats are chosen at their first call (see the module).
    Built by `sparsec.kernel`; the keyword options are `Kernel`'s."""

    def __init__(self, expr: str, formats: Any, make: Any, **options: Any) -> None:
        from ..frontend.parser import parse_expression

        self.expression = expr
        self.options = options
        self._make = make  # sparsec.kernel
        assignment = parse_expression(expr)
        orders = {a.name: a.order for a in assignment.accesses()}
        out = assignment.lhs.name
        if isinstance(formats, str):
            inputs = [n for n in orders if n != out]
            widest = max(inputs, key=lambda n: orders[n], default=None)
            if widest is None or orders[widest] == 0:
                raise FormatError(f"formats='auto': {expr} has no tensor input to choose for")
            formats = {widest: "auto"}
        self.given = {n: f for n, f in formats.items() if not wants_auto({n: f})}
        self.auto = tuple(n for n in formats if n not in self.given)
        unknown = [n for n in self.auto if n not in orders]
        if unknown:
            raise FormatError(
                f"format 'auto' given for {', '.join(map(repr, unknown))}, not a tensor of {expr}"
            )
        if out in self.auto:
            raise FormatError("'auto' chooses input formats; give the output's format")
        self.orders = orders
        self._chosen: OrderedDict[tuple[int, ...], tuple[dict[str, Any], dict[str, Any]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        #: the last call's choice and the inputs it was made for (`last`)
        self._last_call: tuple[dict[str, Any], dict[str, Any]] | None = None

    # ----------------------------------------------------------------- inspection
    @property
    def last(self) -> dict[str, Any] | None:
        """The last call's choice: its kernel, converted inputs, and per auto input how it
        was made (None before any call)."""
        return None if self._last_call is None else self._last_call[0]

    @property
    def formats(self) -> dict[str, Any]:
        """The formats of the last call's kernel (auto inputs: "auto" before any call)."""
        if self.last is None:
            return {**self.given, **{n: "auto" for n in self.auto}}
        return self.last["kernel"].formats

    @property
    def choices(self) -> dict[str, Any]:
        """Per auto input, the last call's candidates: modelled bytes, median ms, chosen."""
        return {} if self.last is None else self.last["why"]

    @property
    def kernel(self) -> Any:
        if self.last is None:
            raise InputError("an auto kernel chooses its formats at its first call; call it first")
        return self.last["kernel"]

    @property
    def source(self) -> str:
        chosen = ", ".join(f"{n}: {w['chosen']}" for n, w in self.choices.items())
        return f"/* formats chosen from the data (formats='auto'): {chosen} */\n" + (
            self.kernel.source
        )

    def __repr__(self) -> str:
        return f"AutoKernel({self.expression!r}, auto: {', '.join(self.auto)})"

    # ----------------------------------------------------------------------- call
    def __call__(self, /, *, threads: int | None = None, **inputs: Any) -> Any:
        found = self._last_call  # the same inputs as the last call: nothing to look up
        if found is None or not self._made_for(found, inputs):
            key = tuple(id(inputs.get(n)) for n in self.auto)
            with self._lock:
                found = self._chosen.get(key)
                if found is not None and self._made_for(found, inputs):
                    self._chosen.move_to_end(key)
                else:
                    found = None
            if found is None:
                found = self._choose(inputs, threads)
                with self._lock:
                    self._chosen[key] = found
                    while len(self._chosen) > KEEP:
                        self._chosen.popitem(last=False)
            self._last_call = found
        state = found[0]
        return state["kernel"](threads=threads, **{**inputs, **state["converted"]})

    def _made_for(self, found: tuple[dict[str, Any], dict[str, Any]], inputs: Any) -> bool:
        """Whether a kept choice was made for these very input objects (a reused id of a
        collected object is not the same input)."""
        return all(found[1][n] is inputs.get(n) for n in self.auto)

    def check(self, /, *, threads: int | None = None, **inputs: Any) -> Any:
        """`Kernel.check` of the kernel these inputs choose (chosen first, if need be)."""
        self(threads=threads, **inputs)
        assert self.last is not None
        return self.last["kernel"].check(threads=threads, **{**inputs, **self.last["converted"]})

    def _choose(
        self, inputs: dict[str, Any], threads: int | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        formats: dict[str, Any] = dict(self.given)
        converted: dict[str, Any] = {}
        why: dict[str, Any] = {}
        for name in self.auto:  # one at a time, the others as chosen so far (else default)
            if name not in inputs:
                raise InputError(f"missing input {name!r}")
            value = _as_sparse(inputs[name], name)
            if value.order != 2:
                formats[name] = default_sparse(value.order)
                converted[name] = as_tensor(value, formats[name], name=name)
                why[name] = {"chosen": str(formats[name]), "candidates": {}}
                continue
            coords, _ = value.coords()
            shape = Shape.of((value.shape[0], value.shape[1]), coords)
            rest = {n: "csr" for n in self.auto if n not in formats and n != name}
            tried: dict[str, dict[str, float]] = {}
            runs: dict[str, Any] = {}
            for fmt in candidates(shape, value.dtype.itemsize):
                try:
                    k = self._make(self.expression, {**formats, **rest, name: fmt}, **self.options)
                    made = as_tensor(value, fmt, name=name)
                    args = {**inputs, **converted, name: made}
                    k(threads=threads, **args)  # compiled and warm before timing
                except FormatError:
                    continue
                runs[fmt] = (k, made, args)
                tried[fmt] = {"bytes": shape.bytes(fmt, value.dtype.itemsize)}
            samples: dict[str, list[float]] = {f: [] for f in runs}
            for _ in range(ROUNDS):
                for fmt, (k, _, args) in runs.items():
                    samples[fmt].append(_per_call(k, args, threads))
            medians = {f: float(np.median(got)) for f, got in samples.items()}
            for fmt, median in medians.items():
                tried[fmt]["median_ms"] = median * 1e3
            fastest = min(medians.values())
            # within the timing's resolution of the fastest, the model decides: fewest bytes
            close = [f for f in medians if medians[f] <= (1 + TIE) * fastest]
            best = min(close, key=lambda f: (tried[f]["bytes"], medians[f]))
            if "csr" in medians and best != "csr":
                if medians[best] > (1 - MARGIN) * medians["csr"]:
                    best = "csr"
            formats[name] = best
            converted[name] = runs[best][1]
            why[name] = {"chosen": best, "candidates": tried}
        k = self._make(self.expression, formats, **self.options)
        state = {"kernel": k, "converted": converted, "why": why}
        return state, {n: inputs.get(n) for n in self.auto}


def _per_call(k: Any, args: dict[str, Any], threads: int | None) -> float:
    """Seconds per call of ``k`` on ``args``, over calls that fill `ROUND_S` after one
    untimed call."""
    k(threads=threads, **args)
    calls, start = 0, time.perf_counter()
    while True:
        k(threads=threads, **args)
        calls += 1
        spent = time.perf_counter() - start
        if spent >= ROUND_S or calls >= ROUND_CALLS:
            return spent / calls


def _as_sparse(value: Any, name: str) -> Tensor | MappedTensor:
    """An auto input as a sparsec tensor in its own format (for its entries): a sparse
    one as it is stored, a dense one in the default sparse format of its order."""
    if isinstance(value, Tensor | MappedTensor):
        return value
    if hasattr(value, "tocoo") or getattr(value, "is_sparse", False) or _torch_sparse(value):
        return as_tensor(value, name=name)
    return as_tensor(value, default_sparse(np.ndim(value)), name=name)


def _torch_sparse(value: Any) -> bool:
    layout = str(getattr(value, "layout", ""))
    return layout.startswith("torch.sparse")
