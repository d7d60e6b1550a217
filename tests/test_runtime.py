"""Compile cache and toolchain handling."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

import sparsec
from sparsec.base.errors import CompileError
from sparsec.policy.machine import compiler_target
from sparsec.runtime import build as runtime

SOURCE = "int sparsec_kernel(void) { return 7; }\n"


def test_cache_is_content_addressed_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    lib = runtime.compile_cached(SOURCE + "/* a */\n")
    assert lib.sparsec_kernel() == 7
    files = list(tmp_path.glob("*.so"))
    assert len(files) == 1
    runtime._loaded.clear()
    stamp = files[0].stat().st_mtime_ns
    runtime.compile_cached(SOURCE + "/* a */\n")
    assert files[0].stat().st_mtime_ns == stamp  # not rebuilt
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.c"))
    assert len(list(tmp_path.glob("*.sha256"))) == 1


def test_flags_are_part_of_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPARSEC_CFLAGS", "-O1")
    runtime.compile_cached(SOURCE + "/* b */\n")
    monkeypatch.setenv("SPARSEC_CFLAGS", "-O2")
    runtime.compile_cached(SOURCE + "/* b */\n")
    assert len(list(tmp_path.glob("*.so"))) == 2


def _fake_compiler(tmp_path, cc1_line: str):
    """A compiler driver that answers ``-###`` with ``cc1_line`` (the CPU it resolves
    ``-march=native`` to comes from $FAKE_CPU) and compiles with the real ``cc``."""
    script = tmp_path / "fake-cc"
    script.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do if [ "$a" = "-###" ]; then\n'
        "  echo '" + cc1_line.replace("$FAKE_CPU", "'\"$FAKE_CPU\"'") + "' >&2; exit 0\n"
        "fi; done\n"
        'exec cc "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def test_the_key_holds_the_target_the_compiler_resolves(tmp_path, monkeypatch):
    """A cache shared by machines of different CPUs: the same source and the same literal
    ``-march=native`` resolve to different targets, so each CPU gets its own library."""
    base = runtime.Toolchain(("cc",), ("-O3", "-march=native"), "gcc 12")
    znver3 = runtime.cache_key(SOURCE, replace(base, target=("-march=znver3", "-mavx2")))
    skylake = runtime.cache_key(SOURCE, replace(base, target=("-march=skylake", "-mavx2")))
    assert len({runtime.cache_key(SOURCE, base), znver3, skylake}) == 3

    cache = tmp_path / "shared"
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(cache))
    line = ' /usr/lib/gcc/cc1 -quiet /dev/null "-march=$FAKE_CPU" -mavx2 --param "l2-cache-size=512" -o /tmp/x.s'
    monkeypatch.setenv("SPARSEC_CC", _fake_compiler(tmp_path, line))
    keys = []
    for cpu in ("alpha", "beta", "alpha"):
        monkeypatch.setenv("FAKE_CPU", cpu)
        compiler_target.cache_clear()  # what one process per machine would resolve
        runtime._loaded.clear()
        tc = runtime.toolchain()
        assert tc.target == (f"-march={cpu}", "-mavx2", "--param", "l2-cache-size=512")
        keys.append(runtime.cache_key(SOURCE, tc))
        assert runtime.compile_cached(SOURCE + "/* t */\n").sparsec_kernel() == 7
    assert keys[0] != keys[1] and keys[0] == keys[2]
    assert len(list(cache.glob("*.so"))) == 2
    compiler_target.cache_clear()


def test_the_resolved_target_of_gcc_and_clang_drivers(tmp_path):
    clang = _fake_compiler(
        tmp_path,
        ' "/usr/bin/clang-17" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-target-cpu" "znver4"'
        ' "-target-feature" "+avx512f" "-o" "/tmp/x.o" "-x" "c" "/dev/null"',
    )
    got = compiler_target((clang,), ("-march=native",))
    assert got == (
        "-triple", "x86_64-pc-linux-gnu", "-target-cpu", "znver4", "-target-feature", "+avx512f",
    )  # fmt: skip
    assert compiler_target(("no-such-compiler-here",), ("-march=native",)) == ()
    real = compiler_target(("cc",), ("-O3", "-march=native"))
    if any(t.startswith("-march=") for t in real):  # gcc: native resolved to a CPU
        assert "-march=native" not in real
    assert runtime.toolchain().target  # resolved, or the CPU's flags in its place


def test_truncated_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    src = SOURCE + "/* c */\n"
    key = runtime.cache_key(src, runtime.toolchain())
    (tmp_path / f"{key}.so").write_bytes(b"\x7fELF garbage")
    assert runtime.compile_cached(src).sparsec_kernel() == 7


def test_foreign_but_loadable_cache_entry_is_detected(tmp_path, monkeypatch):
    # another kernel's library under this key would load fine and compute the wrong thing
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    other = "int sparsec_kernel(void) { return 8; }\n"
    runtime.compile_cached(other)
    (other_so,) = tmp_path.glob("*.so")
    src = SOURCE + "/* f */\n"
    key = runtime.cache_key(src, runtime.toolchain())
    (tmp_path / f"{key}.so").write_bytes(other_so.read_bytes())
    (tmp_path / f"{key}.sha256").write_text("0" * 64 + "\n")
    runtime._loaded.clear()
    assert runtime.compile_cached(src).sparsec_kernel() == 7


def test_builds_of_one_source_are_byte_identical(tmp_path, monkeypatch):
    """Processes that build one cache entry at once each replace the library, then its
    hash sidecar: only identical bytes keep whichever pair lands last in agreement (the
    compiler records the source's file name, which must not vary)."""
    src = SOURCE + "/* g */\n"
    built = []
    for where in ("one", "two"):
        monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path / where))
        runtime._loaded.clear()
        assert runtime.compile_cached(src).sparsec_kernel() == 7
        (library,) = (tmp_path / where).glob("*.so")
        built.append(library.read_bytes())
        assert sorted(p.suffix for p in (tmp_path / where).iterdir()) == [".sha256", ".so"]
    assert built[0] == built[1]


def test_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPARSEC_CC", "no-such-compiler-xyz")
    with pytest.raises(CompileError, match="not found"):
        runtime.compile_cached(SOURCE + "/* d */\n")


def test_failing_compiler_reports_its_message(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError, match="error"):
        runtime.compile_cached("this is not C\n")
    assert not list(tmp_path.iterdir())  # no source or partial library left behind


def test_a_build_that_fails_after_compiling_leaves_nothing_behind(monkeypatch, tmp_path):
    """Installing the new library fails: the error comes through, and neither the source's
    directory nor the uninstalled library stays in the cache."""
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))

    def broken(src: str, dst: str) -> None:
        raise OSError("install failed")

    monkeypatch.setattr(runtime.os, "replace", broken)
    with pytest.raises(OSError, match="install failed"):
        runtime.compile_cached(SOURCE + "/* installed */\n")
    monkeypatch.undo()
    assert not list(tmp_path.iterdir())


def test_unwritable_cache_dir_falls_back(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(ro / "sub"))
    try:
        assert runtime.compile_cached(SOURCE + "/* e */\n").sparsec_kernel() == 7
    finally:
        os.chmod(ro, 0o700)


def test_serial_and_parallel_kernels_agree(rng):
    from conftest import sparse_array

    A = sparse_array((50, 40), rng)
    x = rng.uniform(size=40)
    par = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    ser = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, schedule="serial")
    assert "omp parallel" in par.source and "omp parallel" not in ser.source
    np.testing.assert_array_equal(par(A=A, x=x), ser(A=A, x=x))


def test_address_of_writable_read_only_and_empty_arrays():
    from sparsec.tensors.buffers import address

    a = np.arange(6.0)
    assert address(a) == a.ctypes.data
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    assert address(frozen) == frozen.ctypes.data
    empty = np.empty(0)
    assert address(empty) == empty.ctypes.data
    # a kernel reads a read-only input through the fast path as well as the first call
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "dense"})
    m = np.arange(12.0).reshape(3, 4)
    m.flags.writeable = False
    for _ in range(2):
        np.testing.assert_array_equal(k(A=m, x=frozen), m @ frozen)


def test_repeated_kernel_requests_return_the_same_kernel(monkeypatch):
    expr = "y(i) = A(i,j) * x(j)"
    k = sparsec.kernel(expr, {"A": "csr"})
    assert sparsec.kernel(expr, {"A": "csr"}) is k
    assert sparsec.kernel(expr, {"A": "csc"}) is not k
    assert sparsec.kernel(expr, {"A": "csr"}, dtype="float32") is not k
    assert sparsec.kernel(expr, {"A": "csr"}, schedule="serial") is not k
    assert sparsec.kernel(expr, {"A": "csr"}, target="cuda-emulated") is not k
    f32 = sparsec.kernel(expr, {"A": "csr"}, dtype=np.float32)
    assert f32 is sparsec.kernel(expr, {"A": "csr"}, dtype=np.float32) and f32.dtype == "float32"
    # arguments with no frozen spelling are not memoized (the kernel is built anew)
    from sparsec.api.kernel import _memo_key

    assert _memo_key(expr, {"A": object()}, "c", None, None, None) is None
    assert _memo_key(expr, {"A": "csr"}, "c", ["split(i,i0,i1,4)"], None, None) is not None
    # a changed toolchain gets a kernel of its own (it will build its own library)
    monkeypatch.setenv("SPARSEC_CFLAGS", "-O2 -fopenmp")
    other = sparsec.kernel(expr, {"A": "csr"})
    assert other is not k
    a = sparsec.Tensor.from_dense(np.eye(3), "csr")
    np.testing.assert_array_equal(other(A=a, x=np.arange(3.0)), [0.0, 1.0, 2.0])


LIBC_SOURCE = """#include <stddef.h>
#include <stdint.h>
void* calloc(size_t count, size_t size);
void free(void* p);
void* memcpy(void* restrict to, const void* restrict from, size_t n);
int sparsec_kernel(void) {
  int64_t b[4] = {1, 2, 3, 4}, s = 0;
  int64_t* a = (int64_t*)calloc(4, sizeof *a);
  memcpy(a, b, sizeof b);
  #pragma omp parallel for reduction(+:s) num_threads(2)
  for (int i = 0; i < 4; i++) s += a[i];
  free(a);
  return (int)s - 3;
}
"""


def test_c_kernels_link_lean_and_bind_the_c_library_when_loaded(tmp_path, monkeypatch):
    """No -lc: calloc, free and memcpy are bound when the library is loaded; OpenMP's
    runtime is still linked (by -fopenmp)."""
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_lean_failed", set())
    assert runtime.toolchain().link == runtime.LEAN_LINK
    assert runtime.toolchain("c++").link == runtime.FULL_LINK
    assert runtime.compile_cached(LIBC_SOURCE).sparsec_kernel() == 7
    # a source that does not compile is the source's fault, not the lean link's
    with pytest.raises(CompileError):
        runtime.compile_cached("this is not C\n")
    assert not runtime._lean_failed and runtime.toolchain().link == runtime.LEAN_LINK


def test_a_lean_link_that_fails_is_retried_in_full(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_lean_failed", set())
    monkeypatch.setattr(runtime, "LEAN_LINK", ("-nodefaultlibs", "-lsparsec_no_such_library"))
    lean = runtime.toolchain()
    assert runtime.compile_cached(LIBC_SOURCE + "/* f */\n").sparsec_kernel() == 7
    assert runtime._lean_failed == {lean}
    assert runtime.toolchain().link == runtime.FULL_LINK  # for the rest of the process
    runtime._loaded.clear()
    assert runtime.compile_cached(LIBC_SOURCE + "/* f */\n").sparsec_kernel() == 7
    assert len(list(tmp_path.glob("*.so"))) == 1  # the full build, found again


def test_a_lean_library_that_does_not_load_is_rebuilt_in_full(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_lean_failed", set())
    lean = runtime.toolchain()
    lean_path = str(tmp_path / f"{runtime.cache_key(LIBC_SOURCE, lean)}.so")
    real = runtime.ctypes.CDLL

    def cdll(path, *args, **kwargs):
        if str(path) == lean_path:
            raise OSError(f"{path}: undefined symbol: calloc")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(runtime.ctypes, "CDLL", cdll)
    assert runtime.compile_cached(LIBC_SOURCE).sparsec_kernel() == 7
    assert runtime._lean_failed == {lean}
    assert runtime.toolchain().link == runtime.FULL_LINK
    # another process: the lean library still does not load, the full one is found
    runtime._loaded.clear()
    runtime._lean_failed.clear()
    full = sorted(tmp_path.glob("*.so"), key=lambda f: str(f) == lean_path)[0]
    stamp = full.stat().st_mtime_ns
    assert runtime.compile_cached(LIBC_SOURCE).sparsec_kernel() == 7
    assert full.stat().st_mtime_ns == stamp and len(list(tmp_path.glob("*.so"))) == 2


@pytest.mark.parametrize(
    ("version", "aligned"),
    [
        ("cc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation", True),
        ("gcc (GCC) 9.4.0", True),
        ("Ubuntu clang version 14.0.0-1ubuntu1", True),
        ("clang version 12.0.1", False),  # -falign-loops came in Clang 13
        ("icx (ICX) 2024.0.0 Intel(R) oneAPI DPC++/C++ Compiler", False),  # not known to
    ],
)
def test_default_flags_align_loops_where_the_compiler_takes_it(version, aligned):
    """Short inner loops start on a 32-byte boundary (`ALIGN_LOOPS`) with compilers known
    to take the flag; any other compiler gets the plain defaults, which it compiles."""
    flags = runtime.default_cflags(f"/usr/bin/cc\n{version}")
    assert flags[:3] == ("-O3", "-march=native", "-fopenmp")
    assert (runtime.ALIGN_LOOPS in flags) is aligned


def test_the_default_flags_compile_and_a_user_s_flags_are_taken_as_given(monkeypatch):
    """This machine's compiler takes the default flags (a kernel builds and runs), and
    ``SPARSEC_CFLAGS`` replaces them whole."""
    monkeypatch.delenv("SPARSEC_CFLAGS", raising=False)
    tc = runtime.toolchain()
    assert tc.flags[: len(runtime.default_cflags(tc.identity))] == runtime.default_cflags(
        tc.identity
    )
    assert runtime.compile_cached(SOURCE + "/* defaults */\n").sparsec_kernel() == 7
    monkeypatch.setenv("SPARSEC_CFLAGS", "-O2")
    assert (
        runtime.toolchain().flags[0] == "-O2"
        and runtime.ALIGN_LOOPS not in runtime.toolchain().flags
    )
