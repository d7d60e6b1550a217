"""The on-disk caches processes share (parser tables, template code, compiled libraries,
autotune results): a damaged entry, or one mixed from two processes' writes, is rebuilt,
never used and never a crash (issue 36, item 14)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.api import autotune
from sparsec.backends import printer
from sparsec.frontend import parser

ROOT = Path(__file__).resolve().parent.parent
STATEMENTS = (
    "y(i) = A(i,j) * x(j) + x(i)",
    "a = B(i,j) * C(j,i)",
    "A(i,j) = B(i,k) * C(k,j) + D(i,j) / 2.5",
    "y(i) += -relu(B(i,j)) * max(c(j), 1.0)",
)


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, SPARSEC_CACHE_DIR=str(cache), **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


#: a process that parses `STATEMENTS` (each must print back as written)
PARSE = (
    "from sparsec.frontend.parser import parse_expression as p\n"
    f"for t in {STATEMENTS!r}: assert str(p(t)) == t, p(t)\n"
)


def _tables_written_by(cache: Path, seed: int) -> bytes:
    """The parser-table entry a process with hash seed ``seed`` writes into ``cache`` (an
    entry already there is removed first). Lark's tables pickle sets and memo ids, so the
    bytes differ from process to process."""
    for old in cache.glob("grammar-*.lark"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-c", PARSE], env=_env(cache, PYTHONHASHSEED=str(seed)), check=True
    )
    (entry,) = cache.glob("grammar-*.lark")
    return entry.read_bytes()


@pytest.fixture
def fresh_parser(monkeypatch, tmp_path):
    """The parser made anew from the cache directory ``tmp_path / 'cache'`` (and again
    from the session's afterwards)."""
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(parser, "_distrusted", False, raising=False)
    lark = parser._lark
    lark.cache_clear()
    yield tmp_path / "cache"
    lark.cache_clear()


def _parses_right() -> None:
    for text in STATEMENTS:
        assert str(parser.parse_expression(text)) == text


def test_tables_mixed_from_two_writers_are_rebuilt(tmp_path) -> None:
    """Two processes writing the tables at once left the first 4 KiB of one's file followed
    by the rest of the other's: a process loading it got lark tables whose parse table and
    rules came from different writers (KeyError: '__atom_star_0' out of sparsec.kernel, or
    the AST builder called with the wrong arguments). Every such mix now parses right."""
    cache = tmp_path / "cache"
    written = [_tables_written_by(cache, seed) for seed in range(3)]
    (entry,) = cache.glob("grammar-*.lark")
    failed = []
    for head, tail in itertools.permutations(written, 2):
        entry.write_bytes(head[:4096] + tail[4096:])
        run = subprocess.run(
            [sys.executable, "-c", PARSE], env=_env(cache), capture_output=True, text=True
        )
        if run.returncode:
            failed.append(run.stderr.strip().splitlines()[-1])
    assert not failed, failed


def test_damaged_tables_are_rebuilt(fresh_parser) -> None:
    _parses_right()
    (entry,) = fresh_parser.glob("grammar-*.lark")
    whole = entry.read_bytes()
    for damaged in (b"", whole[:40], whole[: len(whole) // 2], whole[:-1] + b"\0", b"\0" * 64):
        entry.write_bytes(damaged)
        parser._lark.cache_clear()
        _parses_right()
        assert entry.read_bytes() != damaged  # rewritten whole
    assert not [p for p in fresh_parser.iterdir() if p.suffix == ".tmp"]


def test_a_parser_that_fails_inside_is_rebuilt(fresh_parser, monkeypatch) -> None:
    """Tables that load but fail inside lark (a KeyError, a TypeError from the AST builder)
    make the process parse with a parser built from the grammar from then on; a failure
    of that one is a ParseError, never lark's exception."""

    class Broken:
        def parse_interactive(self, text: str) -> None:
            raise KeyError("__atom_star_0")

    real = parser._lark
    made: list[bool] = []

    def lark(fresh: bool = False):  # noqa: ANN202
        made.append(fresh)
        return real(fresh=True) if fresh else Broken()

    monkeypatch.setattr(parser, "_lark", lark)
    _parses_right()
    assert made[:2] == [False, True] and all(made[1:])  # the broken one was tried once
    monkeypatch.setattr(parser, "_lark", lambda fresh=False: Broken())
    monkeypatch.setattr(parser, "_distrusted", False)
    with pytest.raises(sparsec.ParseError, match="the parser failed: KeyError"):
        parser.parse_expression(STATEMENTS[0])


def test_damaged_template_code_is_compiled_again(monkeypatch, tmp_path) -> None:
    """jinja's file cache unpickled a damaged entry's header (UnpicklingError out of
    sparsec.kernel); the entry is now checked by its digest and compiled anew."""
    from jinja2.bccache import bc_magic

    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    printer.environment.cache_clear()
    try:
        want = sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}).source
        (entry,) = tmp_path.glob("template-*.jinja")
        whole = entry.read_bytes()
        for damaged in (bc_magic + b"\x80\x05junk", whole[:30], whole[:-3], b"\0" * 99):
            entry.write_bytes(damaged)
            printer.environment.cache_clear()
            assert sparsec.Kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}).source == want
    finally:
        printer.environment.cache_clear()


def test_damaged_autotune_table_tunes_again(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path))
    path = Path(autotune._path())
    for damaged in ("[1, 2]", '{"k": 3}', '{"k": {"schedule": 5, "medians_ms": {}}}', "{"):
        path.write_text(damaged)
        assert autotune.lookup("k") is None
    autotune.record("k", {"schedule": None, "medians_ms": {"default": 1.0}})
    assert autotune.lookup("k") == {"schedule": None, "medians_ms": {"default": 1.0}}
    assert json.loads(path.read_text())["k"]["schedule"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["autotune.json"]


@pytest.mark.slow
def test_processes_racing_on_a_fresh_cache(tmp_path) -> None:
    """Six processes start on one empty cache at once, twice over (the second time on
    whatever the first left): every one parses, builds and runs right."""
    cache = tmp_path / "cache"
    env = dict(os.environ, SPARSEC_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    code = (
        "import numpy as np, scipy.sparse as sp, sparsec\n"
        f"for t in {STATEMENTS!r}: sparsec.frontend.parser.parse_expression(t)\n"
        "A = sp.random(9, 7, 0.3, random_state=1, format='csr')\n"
        "k = sparsec.kernel('y(i) = A(i,j) * x(j) + z(i)', {'A': 'csr'})\n"
        "print(repr(k(A=A, x=np.arange(7.0), z=np.ones(9)).tolist()))\n"
    )
    A = sp.random(9, 7, 0.3, random_state=1, format="csr")
    want = A @ np.arange(7.0) + 1
    for _ in range(2):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(seed)],
                env=dict(env, PYTHONHASHSEED=str(seed)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in range(6)
        ]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            np.testing.assert_allclose(eval(out), want, rtol=1e-12)  # noqa: S307
    assert not [p.name for p in cache.iterdir() if p.name.endswith(".tmp")]
