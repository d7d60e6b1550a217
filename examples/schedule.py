"""Schedules: the same SpMV three ways, each checked against scipy, with the code it runs.

python examples/schedule.py
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

import sparsec

rng = np.random.default_rng(0)
A = sp.random(2000, 1500, density=0.01, format="csr", random_state=1)
x = rng.standard_normal(1500)
want = A @ x

SCHEDULES = {
    "default": None,
    "row blocks": "split(i,i0,i1,32), parallelize(i0,CPUThread,NoRaces)",
    "nonzero-parallel": "fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,256), "
    "parallelize(c,CPUThread,Atomics)",
}

for name, schedule in SCHEDULES.items():
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, schedule=schedule)
    y = k(A=A, x=x, threads=2)
    assert np.allclose(y, want)
    print(f"{name:17s} matches scipy: {k.schedule}")

# a schedule that would race is refused, with what would work instead
try:
    sparsec.kernel(
        "y(i) = A(i,j) * x(j)",
        {"A": "csr"},
        schedule="fuse(i,j,f), pos(f,fp,A), split(fp,c,fp2,256), parallelize(c,CPUThread,NoRaces)",
    )
except sparsec.ScheduleError as err:
    print(f"refused: {err}")

print(k.source.split("int sparsec_kernel")[1])
