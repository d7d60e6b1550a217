"""What a kernel is compiled for, as one value: a `Target` says what the target can do
(GPU loops, OpenMP loops, the lanes of a warp, the largest block, whether the GPU is
emulated on the CPU), made once from the user's ``target=`` string at the API edge
(`by_name`) and carried through the pipeline, the lowering and the runtime, which ask it
for a capability and never compare its name. How a target's source is spelled is the
printer's table (`sparsec.backends.targets`); how it is compiled and launched, the
runtime's (docs/architecture.md, "A new target")."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SparsecError


@dataclass(frozen=True, slots=True)
class Target:
    """One target's capabilities. ``name`` is the user's spelling, for messages and
    cache keys; nothing decides by it."""

    name: str
    #: the language its source is printed in: the printer's table (`backends.targets`)
    language: str
    #: loops map to GPU units (grid, blocks, warps, threads) and the kernel is launched
    gpu: bool = False
    #: loops on CPU units become OpenMP pragmas (the kernel takes ``sc_threads``)
    openmp: bool = False
    #: the lanes of a warp (GPU only): a warp loop's width, the lanes a shuffle reduces
    lanes: int = 0
    #: the most threads of one block (GPU only)
    max_block: int = 0
    #: a GPU kernel run on the CPU by the emulation: its inputs and output are host arrays
    emulated: bool = False

    @property
    def device(self) -> bool:
        """Inputs and outputs may live in the device's memory (a GPU that is not emulated)."""
        return self.gpu and not self.emulated

    def __str__(self) -> str:
        return self.name


#: OpenMP C, compiled by the system's C compiler and loaded with ctypes
C = Target("c", "c", openmp=True)
#: CUDA, compiled by NVRTC (through CuPy) and launched on the device
CUDA = Target("cuda", "cuda", gpu=True, lanes=32, max_block=1024)
#: the CUDA kernel compiled as C++ with a shim of the CUDA built-ins and run on the CPU
CUDA_EMULATED = Target("cuda-emulated", "cuda", gpu=True, lanes=32, max_block=1024, emulated=True)

#: every target by its name, in the order messages list them
TARGETS = {t.name: t for t in (C, CUDA, CUDA_EMULATED)}


def by_name(name: object) -> Target:
    """The target called ``name``; any other value is a `SparsecError` that lists them."""
    found = TARGETS.get(name) if isinstance(name, str) else None
    if found is None:
        raise SparsecError(f"unknown target {name!r}; supported targets: {', '.join(TARGETS)}")
    return found
