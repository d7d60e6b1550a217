"""The ``sparsec`` command line: output, --check verdicts, and errors (exit 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sparsec
from sparsec.cli import main

MTTKRP = "A(i,j)=B(i,k,l)*D(l,j)*C(k,j)"


def test_compile_prints_c(capsys):
    assert main(["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr"]) == 0
    out = capsys.readouterr().out
    assert "int sparsec_kernel(" in out and "A2_pos" in out


def test_check_mttkrp_default_formats(capsys):
    assert main(["compile", MTTKRP, "--target", "c", "--check"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("check: ok:") and "max abs error" in last


def test_check_with_dims_and_formats(capsys):
    args = ["compile", "C(i,j) = A(i,k) * B(k,j)", "-f", "A:csr", "-f", "B:csc"]
    assert main([*args, "--dims", "i=40,j=30,k=20", "--check", "--dtype", "float32"]) == 0
    assert "i=40,j=30,k=20" in capsys.readouterr().out


def test_output_file(tmp_path, capsys):
    target = tmp_path / "k.c"
    assert main(["compile", "a = B(i,j) * C(i,j)", "-f", "B:coo", "-o", str(target)]) == 0
    assert "sparsec_kernel" in target.read_text()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["compile", "y(i) = A(i,j * x(j)"], "unbalanced"),
        (["compile", "y(i) = A(i,j) * x(j)", "-f", "A:xyz"], "unknown format"),
        (["compile", "y(i) = A(i,j) * x(j)", "-f", "A"], "NAME:FORMAT"),
        (["compile", "y(i) = A(i,j) * x(j)", "--check", "--dims", "q=3"], "not an index"),
        (["compile", "y(i) = A(i,j) * x(j)", "--check", "--dims", "i=x"], "NAME=SIZE"),
        # issue 23: converted with no schedule; a schedule's refusal stands
        (
            ["compile", "A(i,j) = B(i,j) + C(j,i)", "-f", "B:csr", "-f", "C:csr"]
            + ["--schedule", "reorder(i,j)"],
            "mode ordering",
        ),
        (["compile", "y(i) = A(i,j) * x(j)", "--target", "tpu"], "invalid choice"),
        (["frobnicate"], "invalid choice"),
        (["compile", "y(i) = A(i,j) * x(j)", "--check", "--seed", "-1"], "non-negative"),
        (["compile", "y(i) = A(i,j) * x(j)", "--check", "--density", "1.5"], "from 0 to 1"),
        (["compile", "C(i,j) = A(i,j) * B(i,j)", "-f", "A:csr", "-f", "C:dq"], "error"),
    ],
)
def test_errors_exit_2_without_traceback(args, fragment, capsys):
    try:
        code = main(args)
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert "Traceback" not in err


def test_help_documents_formats():
    out = subprocess.run(
        [sys.executable, "-m", "sparsec", "compile", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert "csr (ds)" in out.stdout and "uqq" in out.stdout and "-f A:csr" in out.stdout


@pytest.mark.parametrize("dims", ["i=100000,j=100000", "i=70000,j=40000"])
def test_check_refuses_what_will_not_fit_in_memory(dims, capsys, monkeypatch):
    from sparsec.api import footprint

    monkeypatch.setattr(footprint, "available_bytes", lambda: 16 * 10**9)  # any machine
    args = ["compile", "C(i,j) = A(i,j) * B(i,j)", "-f", "A:csr", "--check", "--dims", dims]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert "would need about" in captured.err and "16.0 GB this machine has available" in (
        captured.err
    )
    assert "--dims" in captured.err  # what to do instead


def test_check_refusal_comes_before_any_allocation(capsys, monkeypatch):
    from sparsec.api import footprint

    monkeypatch.setattr(footprint, "available_bytes", lambda: 10**6)
    monkeypatch.setattr(sparsec.Kernel, "random_inputs", lambda *a, **k: 1 / 0)
    assert main(["compile", "y(i) = A(i,j) * x(j)", "--check", "--dims", "i=300,j=300"]) == 2
    assert "would need about" in capsys.readouterr().err


def test_check_density_sizes_the_random_inputs(monkeypatch, capsys):
    seen = []
    real = sparsec.Kernel.random_inputs

    def spy(self, dims=None, **options):
        inputs, used = real(self, dims, **options)
        seen.append(inputs["A"].nnz)
        return inputs, used

    monkeypatch.setattr(sparsec.Kernel, "random_inputs", spy)
    args = ["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr", "--dims", "i=100,j=50", "--check"]
    assert main([*args, "--density", "0.02"]) == 0
    assert seen == [100]
    assert capsys.readouterr().out.startswith("check: ok:")


def test_check_prints_one_verdict_line(capsys):
    assert main(["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr", "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("check: ok: y(i) = A(i,j) * x(j)")
    assert (
        main(["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr", "--check", "--print-source"]) == 0
    )
    out = capsys.readouterr().out
    assert "int sparsec_kernel(" in out and out.splitlines()[-1].startswith("check: ok:")


def test_internal_errors_exit_2_without_traceback(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(sys.modules["sparsec.api.kernel"], "kernel", broken)
    assert main(["compile", "y(i) = A(i,j) * x(j)"]) == 2
    err = capsys.readouterr().err
    assert "internal error: IndexError" in err and "report" in err and "Traceback" not in err


def test_cli_process_exits_2_without_traceback():
    # the whole process, as a user runs it
    out = subprocess.run(
        [sys.executable, "-m", "sparsec", "compile", "y(i) = A(i,j) * x(j)", "--seed", "-1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "--seed" in out.stderr


def test_errors_name_the_cli_options_not_the_python_keywords(capsys):
    """Issue 36 item 22: the C target's bfloat16 refusal said "pass dtype='float32', or use
    target='cuda-emulated'"; the CLI reports the same error in its own options."""
    from sparsec.policy.machine import use

    with use(half=frozenset()):
        code = main(["compile", "y(i) = A(i,j) * x(j)", "-f", "A:csr", "--dtype", "bfloat16"])
    err = capsys.readouterr().err
    assert code == 2 and "--dtype float32" in err and "--target cuda-emulated" in err
    assert "dtype=" not in err and "target=" not in err


@pytest.mark.parametrize("fmt", ["bsr(4,2)", "nm(2,4)"])
def test_check_a_mapped_format_at_the_users_extents(fmt, capsys):
    """--dims names the statement's own indices; the check runs the compiled statement over
    the levels (a block's inner extents are the format's, whatever the defaults)."""
    args = ["compile", "Y(i,k) = A(i,j) * X(j,k)", "-f", f"A:{fmt}", "--check"]
    assert main([*args, "--dims", "i=8,j=16,k=3"]) == 0
    out = capsys.readouterr().out
    assert "check: ok" in out and ("i1=4" in out or "s0=2" in out)
