"""Concurrency: threads sharing kernels, processes sharing one compile cache, damaged and
read-only caches. Every result is checked against numpy/scipy."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec

ROOT = Path(__file__).resolve().parent.parent
N = 8

#: (expression, formats, numpy reference over dense operands)
EXPRESSIONS = [
    ("y(i) = A(i,j) * x(j)", {"A": "csr"}, lambda d: d["A"] @ d["x"]),
    ("y(i) = A(i,j) * x(j)", {"A": "dcsr"}, lambda d: d["A"] @ d["x"]),
    ("y(j) = A(i,j) * x(i)", {"A": "csr"}, lambda d: d["A"].T @ d["x"]),
    ("a = B(i,j) * C(i,j)", {"B": "csr", "C": "csr"}, lambda d: np.sum(d["B"] * d["C"])),
    ("A(i,j) = B(i,j) + c(j)", {"B": "csr"}, lambda d: d["B"] + d["c"]),
    ("C(i,j) = A(i,k) * B(k,j)", {"A": "csr"}, lambda d: d["A"] @ d["B"]),
    (
        "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)",
        {"B": "csf"},
        lambda d: np.einsum("ikl,lj,kj->ij", d["B"], d["D"], d["C"]),
    ),
    (
        "y(i) = alpha * A(i,j) * x(j) + z(i)",
        {"A": "coo"},
        lambda d: d["alpha"] * d["A"] @ d["x"] + d["z"],
    ),
]


def _check(text, formats, reference, seed):
    k = sparsec.kernel(text, formats)
    inputs, _ = k.random_inputs(seed=seed)
    got = np.asarray(k(**inputs, threads=2))
    dense = {name: np.asarray(v, dtype=np.float64) for name, v in inputs.items()}
    np.testing.assert_allclose(got, reference(dense), rtol=1e-10, atol=1e-12)


def _run_threads(work) -> None:
    barrier = threading.Barrier(N)
    errors: list[BaseException] = []

    def body(n):
        try:
            barrier.wait(timeout=30)
            work(n)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def test_threads_share_one_compiled_kernel():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    k(A=sp.eye(3, format="csr"), x=np.ones(3))  # compiled (and fast path built) up front
    rng = np.random.default_rng(1)
    cases = [
        (sp.random(200 + n, 150, density=0.05, format="csr", random_state=n), rng.random(150))
        for n in range(N)
    ]

    def work(n):
        A, x = cases[n]
        At = sparsec.Tensor.from_scipy(A)
        for _ in range(20):
            np.testing.assert_allclose(k(A=A, x=x, threads=2), A @ x, rtol=1e-12)
            np.testing.assert_allclose(k(A=At, x=x), A @ x, rtol=1e-12)

    _run_threads(work)


def test_threads_build_and_call_different_kernels():
    _run_threads(lambda n: _check(*EXPRESSIONS[n], seed=n))


# --------------------------------------------------------------------------- processes


SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import sparsec
    sys.path.insert(0, {tests!r})
    from test_concurrency import EXPRESSIONS, _check
    which = [int(a) for a in sys.argv[1:]]
    for n in which:
        _check(*EXPRESSIONS[n], seed=n)
    print("ok", which)
    """
).format(tests=str(ROOT / "tests"))


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARSEC_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "2"
    return env


def _spawn(cache: Path, which: list[int]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, *map(str, which)],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.startswith("ok"), err[-3000:]


def _only_libraries(cache: Path) -> list[Path]:
    """The cache's libraries, after checking that it holds nothing else: each ``.so`` with
    its ``.sha256`` sidecar (see `sparsec.runtime.build`), no temporary ``.c``/``.tmp`` files.
    Beside them: one file of the parser's tables (`sparsec.frontend.parser._tables`) and
    one of the C template's compiled code (`sparsec.backends.printer.environment`)."""
    tables = sorted(cache.glob("grammar-*.lark"))
    templates = sorted(cache.glob("template-*.jinja"))
    assert len(tables) == 1 and tables[0].is_file(), tables
    assert len(templates) == 1 and templates[0].is_file(), templates
    entries = sorted(e for e in cache.iterdir() if e not in tables + templates)
    assert entries and all(e.is_file() and e.suffix in (".so", ".sha256") for e in entries), [
        e.name for e in entries
    ]
    libraries = [e for e in entries if e.suffix == ".so"]
    assert sorted(e.stem for e in entries if e.suffix == ".sha256") == [e.stem for e in libraries]
    return libraries


def _whole(library: Path) -> bool:
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    return library.with_suffix(".sha256").read_text().strip() == digest


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """8 processes at once into one fresh cache: half build the same kernels, half others."""
    cache = tmp_path_factory.mktemp("shared") / "cache"
    same = [[0, 3]] * 4
    different = [[0, 1], [2, 4], [5], [6, 7]]
    _wait([_spawn(cache, which) for which in same + different])
    return cache


def test_processes_share_one_cache(shared_cache):
    libraries = _only_libraries(shared_cache)
    assert len(libraries) == len(EXPRESSIONS)
    assert all(lib.stat().st_size > 1000 and _whole(lib) for lib in libraries)


def test_truncated_cache_entry_is_rebuilt(shared_cache):
    libraries = _only_libraries(shared_cache)
    for lib in libraries:
        lib.write_bytes(b"\x7fELF\x02")
    _wait([_spawn(shared_cache, [0])])
    after = _only_libraries(shared_cache)
    assert len(after) == len(libraries)
    rebuilt = [lib for lib in after if lib.stat().st_size > 1000]
    assert len(rebuilt) == 1 and _whole(rebuilt[0])  # only SpMV's, the one it used


def test_read_only_cache_falls_back(tmp_path):
    cache = tmp_path / "ro"
    cache.mkdir()
    cache.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    try:
        _wait([_spawn(cache, [0, 3])])
    finally:
        cache.chmod(stat.S_IRWXU)
    if os.geteuid() != 0:  # root writes through 0o500; everyone else cannot
        assert not any(cache.iterdir())


def test_uncreatable_cache_falls_back(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _wait([_spawn(blocker / "cache", [1])])
    assert blocker.read_text() == "not a directory"


# ----------------------------------------------------------------- pickling
def _used_spmv_and_spgemm():
    """SpMV and SpGEMM kernels and operands, each already called once (so the tensors hold
    their cached addresses and the kernels their library, fast path and locks)."""
    a = sparsec.random((40, 30), 0.1, "csr", seed=3)
    b = sparsec.random((30, 20), 0.1, "csr", seed=4)
    x = np.random.default_rng(5).random(30)
    spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    spgemm = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"})
    spmv(A=a, x=x, threads=2)
    spmv(A=a, x=x, threads=2)  # the fast path
    spgemm(A=a, B=b, threads=2)
    return spmv, spgemm, a, b, x


def _compute(spmv, spgemm, a, b, x):
    """Runs in a worker process on unpickled kernels and tensors (on two threads, where the
    parent ran OpenMP already); the sparse result comes back pickled."""
    frozen = all(not arr.flags.writeable for t in (a, b) for arr in (t.vals, t.levels[1].crd))
    return frozen, spmv(A=a, x=x, threads=2), spgemm(A=a, B=b, threads=2)


#: objects a forked child inherits without a pickle (set just before forking)
_INHERITED: tuple = ()


def _compute_inherited():
    return _compute(*_INHERITED)


def _check_computed(result, a, b, x) -> None:
    frozen, y, c = result
    assert frozen
    np.testing.assert_allclose(y, a.to_dense() @ x, rtol=1e-12)
    assert isinstance(c, sparsec.Tensor) and not c.vals.flags.writeable
    np.testing.assert_allclose(c.validate().to_dense(), a.to_dense() @ b.to_dense(), rtol=1e-12)


def test_used_tensors_and_kernels_pickle_and_copy():
    import copy
    import pickle

    spmv, spgemm, a, b, x = _used_spmv_and_spgemm()
    for clone in (lambda v: pickle.loads(pickle.dumps(v)), copy.copy, copy.deepcopy):
        ks, ts = (clone(spmv), clone(spgemm)), (clone(a), clone(b))
        assert all(t._addresses is None and t._device is None for t in ts)
        assert all(isinstance(k, sparsec.Kernel) for k in ks)
        _check_computed(_compute(*ks, *ts, x), a, b, x)
        assert ks[0].expression == spmv.expression and ks[1].formats == spgemm.formats
    # a scheduled kernel keeps its schedule
    split = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, schedule="split(i,i0,i1,4)")
    assert pickle.loads(pickle.dumps(split)).schedule == split.schedule


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_used_tensors_and_kernels_compute_in_another_process(method):
    import multiprocessing

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    spmv, spgemm, a, b, x = _used_spmv_and_spgemm()
    with multiprocessing.get_context(method).Pool(1) as pool:  # arguments travel pickled
        result = pool.apply_async(_compute, (spmv, spgemm, a, b, x)).get(timeout=120)
    _check_computed(result, a, b, x)


def test_forked_child_runs_inherited_kernels_after_parallel_calls():
    # GNU libgomp's team does not survive fork: a child forked after a multi-threaded call
    # runs on one thread instead of waiting forever for threads it does not have
    import multiprocessing

    global _INHERITED
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork start method on this platform")
    spmv, spgemm, a, b, x = _INHERITED = _used_spmv_and_spgemm()
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            result = pool.apply_async(_compute_inherited).get(timeout=60)
    finally:
        _INHERITED = ()
    _check_computed(result, a, b, x)
