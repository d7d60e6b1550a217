"""C printer and name mangling: readable code, exact parentheses, no user text in C."""

from __future__ import annotations

import pytest

import sparsec
from sparsec.backends.printer import C, Printer
from sparsec.ir import nodes as ir

P = Printer(C)
a, b, c = ir.Var("a"), ir.Var("b"), ir.Var("c")

EXPRS = [
    (ir.Bin("-", a, ir.Bin("-", b, c)), "a - (b - c)"),
    (ir.Bin("-", ir.Bin("-", a, b), c), "a - b - c"),
    (ir.Bin("*", ir.Bin("+", a, b), c), "(a + b) * c"),
    (ir.Bin("+", a, ir.Bin("*", b, c)), "a + b * c"),
    (ir.Bin("/", a, ir.Bin("*", b, c)), "a / (b * c)"),
    (ir.Unary("-", ir.Unary("-", a)), "-(-a)"),
    (ir.Unary("-", ir.Bin("+", a, b)), "-(a + b)"),
    (ir.Bin("&&", ir.Bin("<", a, b), ir.Bin("==", b, c)), "a < b && b == c"),
    (ir.Select(ir.Var("h"), ir.Bin("+", a, ir.IntLit(1)), a), "h ? a + 1 : a"),
    (ir.Load("A2_pos", ir.Bin("+", a, ir.IntLit(1))), "A2_pos[a + 1]"),
    (ir.Call("min", (a, b)), "sc_min(a, b)"),
    (ir.FloatLit(0.5), "((sc_val_t)0.5)"),
]


@pytest.mark.parametrize("node,text", EXPRS)
def test_expression_printing(node, text):
    assert P.expr(node) == text


def test_statement_printing():
    loop = ir.For(
        "i",
        ir.IntLit(0),
        ir.Var("n"),
        ir.block(ir.Assign(ir.Load("y", ir.Var("i")), ir.Var("t"), "+=")),
        ir.Parallel("CPUThread", "dynamic", "chunk"),
    )
    assert P.stmts(loop, 0) == [
        "#pragma omp parallel for schedule(dynamic, chunk) num_threads(sc_threads) if(sc_threads > 1)",
        "for (int64_t i = 0; i < n; i++) {",
        "  y[i] += t;",
        "}",
    ]
    atomic = ir.Assign(ir.Load("y", ir.Var("i")), ir.Var("t"), "+=", atomic=True)
    assert P.stmts(atomic, 0) == ["#pragma omp atomic", "y[i] += t;"]


HOSTILE = [
    # (expression, formats): names that are C keywords, macros, type names or internal names
    ("int(for) = while(for,do) * restrict(do)", {"while": "csr"}),
    ("NAN(p) = INFINITY(p,acc) * int64_t(acc)", {"INFINITY": "csr"}),
    ("sc_threads(i) = i_dim(i,chunk) * A2_pos(chunk)", {"i_dim": "csr"}),
    ("y(i) = _A(i,j) * x(j) + __x(i) * errno", {"_A": "dcsr"}),
]


@pytest.mark.parametrize("expr,formats", HOSTILE)
def test_hostile_names_are_mangled(expr, formats, rng):

    k = sparsec.kernel(expr, formats)
    inputs, _ = k.random_inputs()
    # random_inputs gives sparse inputs in their formats and the rest dense; compile + compare
    k.check(**inputs)
    assert "sparsec kernel:" in k.source


def test_header_lists_every_tensor_format_and_the_abi():
    src = sparsec.kernel("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "uqq"}).source
    assert "formats: A: dense (dd), B: coo (uqq), D: dense (dd), C: dense (dd)" in src
    assert "loop order: i, k, l, j" in src
    assert "arguments: A_vals, B1_pos, B1_crd, B2_crd, B3_crd, B_vals, D_vals, C_vals" in src


def test_kernel_source_compiles_with_warnings_as_errors(tmp_path):
    import subprocess

    for expr, fmts in [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}),
        ("a(i) = b(i) + c(i) + d(i) * e(i)", {"b": "s", "c": "s", "d": "s"}),
        ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j)", {"B": "uqq"}),
        ("Y(i,j) = W(i,k) * X(k,j)", {"W": "csr"}),  # register tiles
    ]:
        path = tmp_path / "k.c"
        path.write_text(sparsec.kernel(expr, fmts).source)
        out = subprocess.run(
            [
                "cc",
                "-std=c11",
                "-fopenmp",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wno-unused-parameter",
                "-Wno-unknown-pragmas",
                "-c",
                str(path),
                "-o",
                str(tmp_path / "k.o"),
            ],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr


def test_generated_source_does_not_follow_the_hash_seed():
    """Two reads of one tensor (``A(k,i)``, ``A(k,j)``) give iterators that print alike;
    their order came from a set, so the source (and the compile cache's key) changed with
    ``PYTHONHASHSEED`` (3 seeds in 8 differed). The same kernels in processes of different
    seeds now print the same source."""
    import os
    import subprocess
    import sys

    program = (
        "import hashlib, sparsec\n"
        "for expr, fmts in [('C(i,j) = A(k,i) * A(k,j)', {'A': 'csc'}),\n"
        "                   ('C(i,j) = A(k,i) * A(k,j)', {'A': 'csc', 'C': 'csr'}),\n"
        "                   ('y(i) = A(i,j) * B(i,j) + A(i,j)', {'A': 'csr', 'B': 'csr'})]:\n"
        "    src = sparsec.kernel(expr, fmts).source\n"
        "    print(hashlib.sha256(src.encode()).hexdigest())\n"
    )
    seen = set()
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
        ).stdout
        seen.add(out)
    assert len(seen) == 1, seen
