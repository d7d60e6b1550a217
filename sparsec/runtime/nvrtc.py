"""CUDA compile checks without a GPU: `verify` compiles a generated ``.cu`` to CUBIN with
NVRTC (the pip wheel ``nvidia-cuda-nvrtc-cu12``, loaded directly with ctypes; a system
``nvcc`` when NVRTC is missing) for each architecture and reads ptxas' report: registers,
spills, stack, and the theoretical occupancy that gives at the launch's block size."""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import CompileError

ARCHS = ("sm_80", "sm_90")


@functools.cache
def nvrtc() -> ctypes.CDLL | None:
    """NVRTC from the ``nvidia-cuda-nvrtc-cu12`` wheel, else a system libnvrtc, else None."""
    candidates: list[str] = []
    try:
        import nvidia.cuda_nvrtc  # type: ignore[import-not-found]

        for base in nvidia.cuda_nvrtc.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "lib", "libnvrtc.so.*")))
    except ImportError:
        pass
    candidates += ["libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so"]
    for path in candidates:
        if ".alt." in path or "builtins" in path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@dataclass(frozen=True, slots=True)
class PtxasInfo:
    """ptxas' report for one kernel and architecture, with the occupancy it allows."""

    arch: str
    compiler: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    block: int
    occupancy: float
    log: str

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def __str__(self) -> str:
        return (
            f"{self.arch}: {self.registers} registers, {self.spill_stores} bytes spill stores, "
            f"{self.spill_loads} bytes spill loads, {self.stack_bytes} bytes stack; "
            f"occupancy {self.occupancy:.0%} at {self.block} threads per block ({self.compiler})"
        )


def occupancy(registers: int, block: int) -> float:
    """Theoretical occupancy on sm_80/sm_90 (64 warps, 32 blocks, 64K registers per SM;
    registers are allocated per warp in units of 256; no shared memory)."""
    warps = -(-block // 32)
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = (65536 // per_warp) // warps
    by_threads = 64 // warps
    blocks = min(by_registers, by_threads, 32)
    return blocks * warps / 64


def verify(source: str, block: int = 256, archs: tuple[str, ...] = ARCHS) -> list[PtxasInfo]:
    """Compile ``source`` for each architecture; a failure is a `CompileError` with the log."""
    if nvrtc() is not None:
        compiler = "NVRTC"
    elif shutil.which("nvcc"):
        compiler = "nvcc"
    else:
        raise CompileError(
            "neither NVRTC nor nvcc is available to compile CUDA: install the extra "
            "sparsec[cuda] (pip install nvidia-cuda-nvrtc-cu12) or put nvcc on PATH"
        )
    return [
        _parse_ptxas(_ptxas_log(source, arch, compiler), compiler, arch, block) for arch in archs
    ]


@functools.lru_cache(maxsize=256)
def _ptxas_log(source: str, arch: str, compiler: str) -> str:
    """ptxas' log for ``source`` on ``arch``, compiled once per process and compiler.

    CUDA 13's NVRTC was seen (on an H100 machine) to return an empty log when it had
    already compiled the same code in the process (its cache is keyed on the generated code:
    a different macro did not help); a log without ptxas' report is compiled again with an
    unused device variable of a fresh name appended, which changes the code ptxas sees and
    not the kernel's registers."""
    lib = nvrtc()
    if compiler != "NVRTC" or lib is None:
        return _nvcc_compile(source, arch)
    log = _nvrtc_compile(lib, source, arch)
    if "Used " not in log:
        nonce = f"\n__device__ int sc_verify_{uuid.uuid4().hex};\n"
        log = _nvrtc_compile(lib, source + nonce, arch)
    if "Used " not in log:
        raise CompileError(f"NVRTC compiled for {arch} but gave no ptxas report:\n{log[-2000:]}")
    return log


def _nvrtc_compile(lib: ctypes.CDLL, source: str, arch: str) -> str:
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(
        ctypes.byref(prog), source.encode(), b"sparsec_kernel.cu", 0, None, None
    )
    if status != 0:
        raise CompileError(f"NVRTC could not create a program (status {status})")
    try:
        opts = [f"--gpu-architecture={arch}", "--ptxas-options=-v", "-std=c++17"]
        array = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(prog, len(opts), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if status != 0:
            raise CompileError(f"NVRTC failed for {arch} (status {status}):\n{log[-4000:]}")
        return log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvcc_compile(source: str, arch: str) -> str:
    with tempfile.TemporaryDirectory(prefix="sparsec-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cmd = [
            "nvcc",
            "-cubin",
            f"-arch={arch}",
            "-Xptxas",
            "-v",
            "-o",
            str(Path(tmp) / "k.cubin"),
            str(src),
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CompileError(f"nvcc failed to run: {err}") from None
        if done.returncode != 0:
            raise CompileError(f"nvcc failed for {arch}:\n{done.stderr[-4000:]}")
        return done.stdout + done.stderr


def _parse_ptxas(log: str, compiler: str, arch: str, block: int) -> PtxasInfo:
    def number(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    registers = number(r"Used (\d+) registers")
    return PtxasInfo(
        arch=arch,
        compiler=compiler,
        registers=registers,
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        stack_bytes=number(r"(\d+) bytes stack frame"),
        block=block,
        occupancy=occupancy(registers, block),
        log=log,
    )
