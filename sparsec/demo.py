"""``python -m sparsec.demo``: compile, check and time SpMV and MTTKRP on built-in data.

The data are generated (seeded): a 20k×20k matrix with ~10 nonzeros per row and empty
rows, and a 200³ tensor with 100k nonzeros. Each kernel is checked against dense torch on
a small instance first, then timed on one thread and on all of them (`configured_threads`:
``OMP_NUM_THREADS`` or every core) against scipy (SpMV) and numpy (MTTKRP), both single
threaded; the speedups are the baseline's time over each.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import sparsec
from sparsec.runtime.binding import configured_threads


def _median_ms(fn, repeat: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def table(rows: list[tuple[Any, ...]], threads: int) -> str:
    """The demo's table: per kernel, its times on 1 and on ``threads`` threads, the
    baseline's, and the speedup over the baseline of each."""
    many_head = f"{threads} threads"
    head = (
        f"{'kernel':40} {'formats':8} {'check':6} {'1 thread':>10} {many_head:>10} "
        f"{'baseline':>16} {'speedup 1':>9} {f'speedup {threads}':>10}"
    )
    lines = [head, "-" * len(head)]
    for name, fmts, verdict, one, many, base_name, base in rows:
        ok = "ok" if verdict.max_abs_error < 1e-9 else "FAIL"
        lines.append(
            f"{name:40} {fmts:8} {ok:6} {one:8.3f}ms {many:8.3f}ms "
            f"{base_name:>6} {base:7.3f}ms {_speedup(base, one):>9} {_speedup(base, many):>10}"
        )
    return "\n".join(lines)


def _speedup(base_ms: float, ms: float) -> str:
    """``base_ms / ms``: one decimal from 1x, two significant digits below (a busy
    machine's 0.04x stays readable, where one decimal would print 0.0x)."""
    if ms <= 0:
        return "-"
    ratio = base_ms / ms
    return f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2g}x"


def main() -> None:
    rows = []
    threads = configured_threads()

    spmv = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    verdict = spmv.check(**spmv.random_inputs({"i": 301, "j": 257})[0])
    A = sparsec.random((20_000, 20_000), 10 / 20_000, "csr", seed=1)
    x = np.random.default_rng(2).uniform(-1, 1, 20_000)
    A_scipy = A.to_scipy()
    np.testing.assert_allclose(spmv(A=A, x=x), A_scipy @ x, rtol=1e-12, atol=1e-12)
    rows.append(
        (
            "SpMV  y(i) = A(i,j)*x(j)",
            "A:csr",
            verdict,
            _median_ms(lambda: spmv(A=A, x=x, threads=1)),
            _median_ms(lambda: spmv(A=A, x=x, threads=threads)),
            "scipy",
            _median_ms(lambda: A_scipy @ x),
        )
    )

    mttkrp = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "csf"})
    verdict = mttkrp.check(**mttkrp.random_inputs({"i": 31, "j": 8, "k": 29, "l": 23})[0])
    B = sparsec.random((200, 200, 200), 100_000 / 200**3, "csf", seed=3)
    rng = np.random.default_rng(4)
    D, C = rng.uniform(size=(200, 16)), rng.uniform(size=(200, 16))
    (i, k, l), v = B.coords()

    def numpy_mttkrp() -> np.ndarray:
        out = np.zeros((200, 16))
        np.add.at(out, i, v[:, None] * D[l] * C[k])
        return out

    np.testing.assert_allclose(mttkrp(B=B, D=D, C=C), numpy_mttkrp(), rtol=1e-10)
    rows.append(
        (
            "MTTKRP A(i,j) = B(i,k,l)*D(l,j)*C(k,j)",
            "B:csf",
            verdict,
            _median_ms(lambda: mttkrp(B=B, D=D, C=C, threads=1)),
            _median_ms(lambda: mttkrp(B=B, D=D, C=C, threads=threads)),
            "numpy",
            _median_ms(numpy_mttkrp),
        )
    )

    print(table(rows, threads))
    print('\nGenerated SpMV kernel (sparsec compile "y(i) = A(i,j) * x(j)" -f A:csr):\n')
    body = spmv.source.split("int sparsec_kernel(", 1)[1]
    body = body.split("\n\n/* sparsec_kernel with its arguments", 1)[0]  # not the packed entry
    print("int sparsec_kernel(" + body)


if __name__ == "__main__":
    main()
