"""Where a forward pass through `sparsec.nn.SparseLinear` layers spends its time, measured by
clocks patched into the sparse path for the length of a `clocked` block.

The parts of one forward, each summed over every SparseLinear call in it:

- kernel: inside the compiled kernels' C entry points (``Loaded.fn`` and ``Loaded.packed``:
  the wall time during which one runs, so panels run on two workers count once; inside the
  compiled panel driver, the time it reports spent in the kernel), and, in a
  layer that runs dense (`SparseLinear.ways`), its ``F.linear`` with the bias;
- op: inside the torch op (`sparsec.api.torch_op.TorchOp.__call__`) but outside the C
  entry: torch's dispatch, the binding, the runtime's copies (a packed column panel, a
  ``+=`` output's start) and the output's allocation;
- layer: inside ``SparseLinear.forward`` but outside the op: the transposes and copies of
  the activations, the bias, the reshapes;
- torch: the rest of the forward (embeddings, attention, softmax, LayerNorm, GELU).

The clocks are Python wrappers (about a microsecond a call, against milliseconds a layer);
they are removed, and every patched kernel's fast path rebuilt, when the block ends.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: the breakdown's parts, in table order
PARTS = ("kernel", "op", "layer", "torch")


@dataclass
class Clock:
    """Seconds spent in the kernels' C entries, the op calls and the layer calls. Kernel
    calls may overlap (the runtime's panels run on worker threads): the kernel time is the
    wall time during which at least one runs."""

    kernel: float = 0.0
    op: float = 0.0
    layer: float = 0.0
    _running: int = 0
    _since: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        self.kernel = self.op = self.layer = 0.0

    def kernel_timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            with self._lock:
                if not self._running:
                    self._since = time.perf_counter()
                self._running += 1
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self._running -= 1
                    if not self._running:
                        self.kernel += time.perf_counter() - self._since

        return call


def _timed(fn: Callable[..., Any], clock: Clock, part: str) -> Callable[..., Any]:
    """``fn`` adding its calls' wall time to ``clock``'s ``part`` (called on one thread)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(clock, part, getattr(clock, part) + time.perf_counter() - start)

    return call


def _loaded(kernel: Any) -> list[Any]:
    """Every loaded library of ``kernel`` (its executables so far, tuned ones included)."""
    found = [*kernel._executables.values(), *kernel._candidates.values()]
    return [e.loaded for e in found]


@contextlib.contextmanager
def clocked(model: Any) -> Iterator[Clock]:
    """A `Clock` that the SparseLinear layers of ``model`` add to while the block runs. Call
    the model once before (so every kernel it runs is built and loaded)."""
    from sparsec.api.torch_op import TorchOp
    from sparsec.nn import SparseLinear

    clock = Clock()
    kernels = {id(k): k for m in model.modules() if isinstance(m, SparseLinear) for k in m.kernels}
    saved: list[tuple[Any, Any, Any]] = []
    for kernel in kernels.values():
        for loaded in _loaded(kernel):
            loaded._built()
            saved.append((loaded, loaded._fn, loaded._packed))
            loaded._fn = clock.kernel_timed(loaded._fn)
            if loaded._packed is not None:
                loaded._packed = clock.kernel_timed(loaded._packed)
        kernel._fast = None  # rebuilt on the next call, around the timed entry
    forward, call, way = SparseLinear.forward, TorchOp.__call__, SparseLinear._forward_way

    def timed_way(layer: Any, x: Any, chosen: str) -> Any:
        if chosen != "dense":
            return way(layer, x, chosen)
        # a dense way's F.linear: the same seconds as its kernel and as its "op"
        start = time.perf_counter()
        try:
            return way(layer, x, chosen)
        finally:
            spent = time.perf_counter() - start
            clock.kernel += spent
            clock.op += spent

    from sparsec.runtime import executable

    def driven(seconds: float) -> None:
        clock.kernel += seconds

    executable.KERNEL_CLOCKS.append(driven)
    SparseLinear.forward = _timed(forward, clock, "layer")  # type: ignore[method-assign]
    TorchOp.__call__ = _timed(call, clock, "op")  # type: ignore[method-assign]
    SparseLinear._forward_way = timed_way  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        SparseLinear.forward = forward  # type: ignore[method-assign]
        TorchOp.__call__ = call  # type: ignore[method-assign]
        SparseLinear._forward_way = way  # type: ignore[method-assign]
        executable.KERNEL_CLOCKS.remove(driven)
        for loaded, fn, packed in saved:
            loaded._fn, loaded._packed = fn, packed
        for kernel in kernels.values():
            kernel._fast = None


def breakdown(model: Any, run: Callable[[], Any], repeats: int = 10) -> dict[str, float]:
    """Median ms per forward of each part (`PARTS`), of the whole (``total``) and of the
    sparse layers (``sparse``: kernel + op + layer), over ``repeats`` calls of ``run``
    (which calls ``model``) after one untimed call. Each part's median is taken alone, so
    the parts need not add up to the total's median exactly."""
    run()
    samples: dict[str, list[float]] = {k: [] for k in (*PARTS, "total", "sparse")}
    with clocked(model) as clock:
        run()  # builds the fast paths around the clocks
        for _ in range(repeats):
            clock.reset()
            start = time.perf_counter()
            run()
            total = time.perf_counter() - start
            parts = {
                "kernel": clock.kernel,
                "op": clock.op - clock.kernel,
                "layer": clock.layer - clock.op,
                "torch": total - clock.layer,
                "total": total,
                "sparse": clock.layer,
            }
            for name, seconds in parts.items():
                samples[name].append(seconds * 1e3)
    return {name: statistics.median(got) for name, got in samples.items()}
