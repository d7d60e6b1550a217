"""The ``sparsec`` command line: output, --check verdicts, and errors (exit 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
        (["compile", "A(i,j) = B(i,j) + C(j,i)", "-f", "B:csr", "-f", "C:csr"], "mode ordering"),
        (["compile", "y(i) = A(i,j) * x(j)", "--target", "tpu"], "invalid choice"),
        (["frobnicate"], "invalid choice"),
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
