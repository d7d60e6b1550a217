"""Build and load C kernels: system compiler, on-disk content-addressed cache, ctypes.

The cache key is a SHA-256 of the source, the compiler's identity, the flags and the target
the compiler resolves them to (``-march=native`` on this CPU: `policy.machine.compiler_target`),
so a changed compiler or flag never reuses a stale library, and a cache shared by machines of
different CPUs never loads a library built for another one. Entries are written atomically
(compile to a temporary file in the cache directory, then ``os.replace``), so several
processes may build the same kernel at once and every reader sees a whole file.

C kernels link lean (`LEAN_LINK`): no default libraries but the OpenMP runtime ``-fopenmp``
brings, libm and the static libgcc. Linking against the C library itself (``-lc``, a linker
script over libc.so.6 and libc_nonshared.a) took half the CPU time of linking a kernel
(docs/decisions.md, "A cold compile's time"); the few C library functions a kernel calls
(calloc, free, memcpy) are bound when it is loaded, from the C library the loading process
and the OpenMP runtime already depend on.
A toolchain that cannot link that way (a failed link, or a library that does not load)
gets the compiler's default link, for the rest of the process.

Environment: ``SPARSEC_CC`` (default ``cc``), ``SPARSEC_CFLAGS`` (default
``-O3 -march=native -fopenmp``, and ``-falign-loops=32`` where the compiler takes it;
``-shared -fPIC`` are always added), ``SPARSEC_CACHE_DIR``
(default: the user cache directory, ``~/.cache/sparsec`` on Linux).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from ..base.errors import CompileError
from ..base.resources import cache_dir
from ..policy.machine import compiler_target, host

DEFAULT_CFLAGS = "-O3 -march=native -fopenmp"
#: added to the default flags by compilers that take it (GCC; Clang from 13): loops start
#: on a 32-byte boundary, so a short inner loop (SpMV's row, 28 bytes) never spans two
#: 64-byte fetch windows. Spanning one slowed SpMV whenever the core's front end was
#: shared (the VM's other hyperthread busy), and nothing otherwise (docs/decisions.md,
#: "Loops start on 32-byte boundaries")
ALIGN_LOOPS = "-falign-loops=32"
REQUIRED_CFLAGS = ("-shared", "-fPIC", "-std=gnu11", "-Werror=implicit-function-declaration")
#: the CUDA emulation builds C++ (SPARSEC_CXX, SPARSEC_CXXFLAGS)
DEFAULT_CXXFLAGS = "-O2 -fopenmp"
REQUIRED_CXXFLAGS = ("-shared", "-fPIC", "-std=c++20")
#: the libraries a kernel links: the compiler's defaults (FULL_LINK), or for C kernels only
#: those it needs beyond the C library (LEAN_LINK; the OpenMP runtime comes with -fopenmp)
FULL_LINK = ("-lm",)
LEAN_LINK = ("-nodefaultlibs", "-lm", "-lgcc")
#: an integral kernel's flags: signed arithmetic wraps, as numpy's (float kernels keep the
#: compiler's freedom over their index arithmetic)
WRAP_FLAGS = ("-fwrapv",)
#: the flags of a C kernel whose decision reassociates its sums (`PassOptions.reassociate`):
#: GCC's and clang's associative math without the rest of -ffast-math (NaN, inf and
#: errno stay IEEE's)
REASSOCIATE_FLAGS = ("-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")


@dataclass(frozen=True, slots=True)
class Toolchain:
    cc: tuple[str, ...]
    flags: tuple[str, ...]
    identity: str
    #: source file suffix: ".c", or ".cpp" for the CUDA emulation
    suffix: str = ".c"
    #: the target the compiler resolves ``flags`` to (`compiler_target`), so a library is
    #: keyed by the CPU it was built for, not by the literal ``-march=native``
    target: tuple[str, ...] = ()
    #: the link's libraries, after the source (`LEAN_LINK` or `FULL_LINK`)
    link: tuple[str, ...] = FULL_LINK


@cache
def _identity(cc: tuple[str, ...]) -> str:
    exe = shutil.which(cc[0])
    if exe is None:
        raise CompileError(
            f"C compiler {cc[0]!r} not found on PATH; install gcc or clang, or set SPARSEC_CC"
        )
    try:
        out = subprocess.run(
            [*cc, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CompileError(f"cannot run C compiler {cc[0]!r}: {err}") from None
    return f"{exe}\n{out.stdout.strip()}"


def toolchain(language: str = "c") -> Toolchain:
    if language == "c++":
        cxx = tuple(shlex.split(os.environ.get("SPARSEC_CXX", "c++"))) or ("c++",)
        flags = tuple(shlex.split(os.environ.get("SPARSEC_CXXFLAGS", DEFAULT_CXXFLAGS)))
        identity = _identity(cxx)
        return Toolchain(cxx, flags + REQUIRED_CXXFLAGS, identity, ".cpp", _target(cxx, flags))
    cc = tuple(shlex.split(os.environ.get("SPARSEC_CC", "cc"))) or ("cc",)
    identity = _identity(cc)
    given = os.environ.get("SPARSEC_CFLAGS")
    flags = tuple(shlex.split(given)) if given is not None else default_cflags(identity)
    tc = Toolchain(cc, flags + REQUIRED_CFLAGS, identity, ".c", _target(cc, flags), LEAN_LINK)
    return _full(tc) if tc in _lean_failed else tc


def default_cflags(identity: str) -> tuple[str, ...]:
    """`DEFAULT_CFLAGS`, with `ALIGN_LOOPS` where the compiler (its `_identity`: path and
    ``--version``) is GCC or Clang 13 or later."""
    flags = tuple(shlex.split(DEFAULT_CFLAGS))
    version = identity.split("\n", 1)[-1]
    clang = re.search(r"clang version (\d+)", version)
    if clang is not None:
        return (*flags, ALIGN_LOOPS) if int(clang.group(1)) >= 13 else flags
    gcc = "Free Software Foundation" in version or re.search(r"\b(gcc|cc) \(", version)
    return (*flags, ALIGN_LOOPS) if gcc else flags


#: the C toolchains whose lean link failed in this process (they link in full since)
_lean_failed: set[Toolchain] = set()


def _full(tc: Toolchain) -> Toolchain:
    return replace(tc, link=FULL_LINK)


def _target(cc: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """What ``cc`` targets under ``flags``; where the compiler cannot say, the CPU's flags
    (then a library built with ``-march=native`` is still keyed by the CPU it ran on)."""
    resolved = compiler_target(cc, flags)
    if resolved:
        return resolved
    return ("cpu-flags", *sorted(host().flags))


def cache_key(source: str, tc: Toolchain) -> str:
    h = hashlib.sha256()
    parts = (
        source,
        tc.identity,
        " ".join(tc.cc),
        " ".join(tc.flags),
        " ".join(tc.target),
        " ".join(tc.link),
    )
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def compile_cached(source: str, language: str = "c", flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The loaded shared library for ``source``, compiled at most once per cache, with
    ``flags`` beyond the toolchain's (an integral kernel's ``-fwrapv``: `WRAP_FLAGS`)."""
    tc = toolchain(language)
    if flags:
        tc = replace(tc, flags=tc.flags + flags)
    key = cache_key(source, tc)
    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        path = cache_dir() / f"{key}.so"
        if not _verified(path):
            path = _build_lean(source, tc, path)
            if tc in _lean_failed:
                tc = _full(tc)
                key = cache_key(source, tc)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            if tc.link != FULL_LINK:  # a lean link that does not load here: in full
                _lean_failed.add(tc)
                tc = _full(tc)
                key = cache_key(source, tc)
                path = cache_dir() / f"{key}.so"
                if not _verified(path):
                    path = _build(source, tc, path)
            else:  # replaced between the check and the load: rebuild once
                path = _build(source, tc, path)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                raise CompileError(f"cannot load compiled kernel {path}: {err}") from None
        _loaded[key] = lib
        return lib


def _build_lean(source: str, tc: Toolchain, dest: Path) -> Path:
    """`_build`; where a lean link fails, once more linked in full (the error, if any, is
    then the full build's); when that succeeds, the toolchain links in full for the rest
    of the process."""
    if tc.link == FULL_LINK:
        return _build(source, tc, dest)
    try:
        return _build(source, tc, dest)
    except CompileError:
        full = _full(tc)
        built = _build(source, full, dest.with_name(f"{cache_key(source, full)}.so"))
        _lean_failed.add(tc)  # the source compiles: the lean link was what failed
        return built


@cache
def _fallback_dir() -> Path:
    """One private build directory per process when the cache directory is unusable."""
    return Path(tempfile.mkdtemp(prefix="sparsec-"))


def _verified(path: Path) -> bool:
    """Is ``path`` a whole cache entry? Its SHA-256 must match the sidecar written with it,
    so a truncated, corrupt or foreign file is rebuilt rather than loaded."""
    try:
        expected = path.with_suffix(".sha256").read_text().strip()
        return hashlib.sha256(path.read_bytes()).hexdigest() == expected
    except OSError:
        return False


def _build(source: str, tc: Toolchain, dest: Path) -> Path:
    """Compile into ``dest`` atomically (temp file + ``os.replace``), then write the hash
    sidecar the same way; fall back to a private temp dir if the cache is unwritable."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        workdir = dest.parent
        if not os.access(workdir, os.W_OK):
            raise PermissionError(str(workdir))
    except OSError:
        workdir = _fallback_dir()
        dest = workdir / dest.name
    # the source's file name is compiled into the library (its symbol table names it), so
    # it is the same in every build: processes that build one entry at once then write the
    # same bytes, and whichever library and sidecar land last still agree
    srcdir = tempfile.mkdtemp(prefix=".src-", dir=workdir)
    src_path = os.path.join(srcdir, "sparsec_kernel" + tc.suffix)
    fd, tmp_so = tempfile.mkstemp(suffix=".so.tmp", dir=workdir)
    os.close(fd)
    cmd = [*tc.cc, *tc.flags, src_path, "-o", tmp_so, *tc.link]
    try:  # the source directory goes however this ends; the library unless installed
        with open(src_path, "w") as f:
            f.write(source)
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CompileError(f"C compiler failed to run ({' '.join(cmd)}): {err}") from None
        if result.returncode != 0:
            raise CompileError(
                f"C compiler failed (exit {result.returncode}) running {' '.join(cmd)}:\n"
                f"{result.stderr.strip()[-4000:]}"
            )
        digest = hashlib.sha256(Path(tmp_so).read_bytes()).hexdigest()
        os.replace(tmp_so, dest)
    except BaseException:
        _unlink(tmp_so)
        raise
    finally:
        shutil.rmtree(srcdir, ignore_errors=True)
    fd, tmp_sum = tempfile.mkstemp(suffix=".sha256.tmp", dir=workdir)
    with os.fdopen(fd, "w") as f:
        f.write(digest + "\n")
    os.replace(tmp_sum, dest.with_suffix(".sha256"))
    return dest


def _unlink(*paths: str) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
