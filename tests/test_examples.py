"""Every script in examples/ runs as a user would run it and prints what it promises.

Each runs in a fresh interpreter (cwd = repo root, the repo on PYTHONPATH, the test session's
private kernel cache inherited through SPARSEC_CACHE_DIR). The benchmark's ``--quick`` mode
runs here too, as a smoke test of the harness (it asserts correctness, never speed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = [
    # (script, substrings its output must contain)
    ("spmv_mtx.py", ["small.mtx: 36 x 36, 156 stored nonzeros", "matches scipy.sparse"]),
    ("mttkrp_tns.py", ["small.tns: 12 x 10 x 8", "ok: matches dense torch", "int sparsec_kernel("]),
    ("pruned_layer.py", ["90% sparse", "loop order o0, b, o1, k, t", "matches torch dense"]),
    ("formats.py", ["dcsr", "j -> i", "all four agree with scipy"]),
    (
        "gpu_kernels.py",
        ["compiled: sm_80", "compiled: sm_90", "matches numpy", "atomicAdd(&A_vals"],
    ),
    (
        "schedule.py",
        ["row blocks        matches scipy", "atomic updates of y", "refused: ", "sc_search("],
    ),
]


#: host facts an example's expected text depends on, fixed so that it holds on any host
#: (SparseLinear's column blocks follow the L1 data cache)
MACHINES = {"pruned_layer.py": "l1=48K"}


def _run(
    args: list[str], timeout: float = 300, machine: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if machine is not None:
        env["SPARSEC_MACHINE"] = machine
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_example_is_listed() -> None:
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert scripts == {name for name, _ in EXAMPLES}


def test_no_example_shadows_a_module() -> None:
    """Python puts a script's folder first on ``sys.path``, so an example named like a module
    that sparsec, numpy, scipy or torch imports (``cuda.py``: torch's optional CUDA bindings)
    would run in its place."""
    stems = {p.stem for p in (ROOT / "examples").glob("*.py")}
    assert not stems & set(sys.stdlib_module_names)
    assert not [s for s in stems if importlib.util.find_spec(s) is not None]
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import numpy, scipy.sparse, scipy.io, torch, sparsec, sparsec.io; "
        "torch.cuda.is_available(); print(sorted(set(sys.argv[2:]) & set(sys.modules)))"
    )
    done = _run(["-c", probe, str(ROOT / "examples"), *sorted(stems)])
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize(("script", "expected"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs(script: str, expected: list[str]) -> None:
    done = _run([str(ROOT / "examples" / script)], machine=MACHINES.get(script))
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    for text in expected:
        assert text in done.stdout, f"{script}: {text!r} not in output:\n{done.stdout}"


def test_bench_quick_smoke() -> None:
    done = _run(["-m", "bench", "core", "--quick", "--no-compile", "--threads", "2"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    for case in ("spmv-random", "spmv-banded", "spmm-float64", "spmm-float32"):
        assert case in done.stdout
    assert "speedup" in done.stdout


def test_bench_sparse_quick_smoke() -> None:
    done = _run(["-m", "bench", "sparse", "--quick"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    for case in ("spgemm-random", "spgemm-bert", "add-random", "add-bert"):
        assert case in done.stdout
    for impl in ("sparsec", "scipy+sort", "torch-csr"):
        assert impl in done.stdout
    assert "speedup" in done.stdout


def test_bench_schedule_quick_smoke() -> None:
    done = _run(["-m", "bench", "schedule", "--quick", "--threads", "2"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    for case in ("spmv", "spmm", "mttkrp"):
        assert f"\n{case} " in done.stdout
    for impl in ("serial", "default", "user"):
        assert impl in done.stdout
    assert "vs serial" in done.stdout


def test_bench_generate_quick_smoke() -> None:
    done = _run(["-m", "bench", "generate", "--quick"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    for case in ("spmv", "spmm", "spgemm", "mttkrp", "spmv-cuda", "spgemm-cuda"):
        assert f" {case} " in done.stdout
    assert " first " in done.stdout and " next " in done.stdout


def test_bench_gpu_quick_smoke() -> None:
    done = _run(["-m", "bench", "gpu", "--quick"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    for case in ("spmv", "spmm", "mttkrp"):
        assert f"\n{case} " in done.stdout
    assert "roofline us" in done.stdout and "occupancy" in done.stdout
    assert "x32 float16" in done.stdout  # a 16-bit SpMM, run by the emulation and verified


def test_bench_e2e_quick_smoke() -> None:
    done = _run(["-m", "bench", "e2e", "--quick", "--threads", "2"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "torch dense ms" in done.stdout and "50%" in done.stdout and "90%" in done.stdout
    # the breakdown of the sparse forward, at the timed batch and at batch 1
    assert "layer around" in done.stdout and "2 x 32" in done.stdout and "1 x 32" in done.stdout


def test_bench_linear_quick_smoke() -> None:
    done = _run(["-m", "bench", "linear", "--quick", "--threads", "2"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "dense/sparse" in done.stdout and "kernel share" in done.stdout
    assert "minilm-up 384->1536" in done.stdout and "50%" in done.stdout and "90%" in done.stdout


def test_bench_linear_structured_quick_smoke() -> None:
    """`--structure`: the layer pruned in whole blocks (issue 39's pruning), same table."""
    done = _run(["-m", "bench", "linear", "--quick", "--threads", "2", "--structure", "4x4"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "pruned in 4x4" in done.stdout and "dense/sparse" in done.stdout
    assert "50%" in done.stdout and "90%" in done.stdout and "6.0x" in done.stdout


def test_bench_linear_bsr_quick_smoke() -> None:
    """`--structure bsr4x4`: the same blocks stored bsr(4,4), a `BlockSparseLinear`, whose
    layer and kernel alone are checked against dense before they are timed."""
    done = _run(["-m", "bench", "linear", "--quick", "--threads", "2", "--structure", "bsr4x4"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "pruned in bsr4x4" in done.stdout and "bsr(4,4)" in done.stdout
    assert "50%" in done.stdout and "90%" in done.stdout and "6.0x" in done.stdout


def test_bench_bert_quick_smoke() -> None:
    done = _run(["-m", "bench", "bert", "--quick", "--threads", "2"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "minilm-query" in done.stdout and "vs torch dense" in done.stdout


def test_bench_panels_quick_smoke() -> None:
    done = _run(["-m", "bench", "panels", "--quick"])
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr}"
    assert "whole ms" in done.stdout and "panels ms" in done.stdout and "chosen" in done.stdout
    assert "bands ms" in done.stdout and "depth ms" in done.stdout
    # the narrow quick shape (a 5 MB X at 512 columns) runs in depth blocks
    assert "48x2560 80% x512" in done.stdout and " depth " in done.stdout


def _taco_env(**more: str) -> dict[str, str]:
    env = dict(os.environ, **more)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("suite", ["taco", "taco_compile"])
def test_bench_taco_without_a_taco_build_says_how_to_get_one(suite: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", suite, "--quick"],
        cwd=ROOT,
        env=_taco_env(SPARSEC_TACO=str(tmp_path / "no-taco"), SPARSEC_TACO_WORK=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no TACO build at" in done.stdout
    assert "git clone https://github.com/tensor-compiler/taco" in done.stdout
    assert "-DPYTHON=OFF" in done.stdout and "make -j2 taco" in done.stdout
    assert not any(tmp_path.iterdir())  # nothing built, nothing drawn


def test_bench_taco_quick_smoke(tmp_path: Path) -> None:
    """With a TACO build (``SPARSEC_TACO``, default ``~/taco-bench/src``): the driver is
    built, the quick inputs drawn, every result checked and the table printed."""
    taco = Path(os.environ.get("SPARSEC_TACO", Path.home() / "taco-bench" / "src"))
    if not (taco / "build" / "lib" / "libtaco.so").exists():
        pytest.skip(f"no TACO build at {taco} (the test above covers that path)")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "taco", "--quick", "--threads", "1,2"],
        cwd=ROOT,
        env=_taco_env(SPARSEC_TACO=str(taco), SPARSEC_TACO_WORK=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for text in ("spmv_rand", "add", "taco-native", "taco fused", "ratio"):
        assert text in done.stdout
    assert "wrong" not in done.stdout and "error" not in done.stdout, done.stdout
