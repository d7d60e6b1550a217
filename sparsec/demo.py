"""``python -m sparsec.demo``: compile, check and time SpMV and MTTKRP on built-in data.

The data are generated (seeded): a 20k×20k matrix with ~10 nonzeros per row and empty
rows, and a 200³ tensor with 100k nonzeros. Each kernel is checked against dense torch on
a small instance first, then timed against scipy (SpMV) and numpy (MTTKRP).
"""

from __future__ import annotations

import os
import time

import numpy as np

import sparsec


def _median_ms(fn, repeat: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def main() -> None:
    rows = []
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))

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
            _median_ms(lambda: spmv(A=A, x=x)),
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
            _median_ms(lambda: mttkrp(B=B, D=D, C=C)),
            "numpy",
            _median_ms(numpy_mttkrp),
        )
    )

    head = f"{'kernel':40} {'formats':8} {'check':6} {'1 thread':>10} {f'{threads} threads':>10} {'baseline':>16} {'speedup':>8}"
    print(head)
    print("-" * len(head))
    for name, fmts, verdict, one, many, base_name, base in rows:
        ok = "ok" if verdict.max_abs_error < 1e-9 else "FAIL"
        print(
            f"{name:40} {fmts:8} {ok:6} {one:8.3f}ms {many:8.3f}ms "
            f"{base_name:>6} {base:7.3f}ms {base / many:7.1f}x"
        )
    print('\nGenerated SpMV kernel (sparsec compile "y(i) = A(i,j) * x(j)" -f A:csr):\n')
    body = spmv.source.split("int sparsec_kernel(", 1)[1]
    body = body.split("\n\n/* sparsec_kernel with its arguments", 1)[0]  # not the packed entry
    print("int sparsec_kernel(" + body)


if __name__ == "__main__":
    main()
