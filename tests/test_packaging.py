"""A non-editable install must carry the grammar and the templates inside the package."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_grammar_and_templates(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("sparsec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "sparsec/grammar/index_notation.lark" in names
    assert "sparsec/templates/kernel.c.j2" in names
    assert "sparsec/cli.py" in names


def test_io_is_reachable_from_a_plain_import():
    # README: tensors load with `sparsec.io.load` after `import sparsec`
    out = subprocess.run(
        [sys.executable, "-c", "import sparsec; print(sparsec.io.load.__name__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "load", out.stderr


def test_readme_says_what_make_test_runs():
    makefile = (ROOT / "Makefile").read_text()
    readme = " ".join((ROOT / "README.md").read_text().split())
    for tool in ("ruff check", "ruff format --check", "mypy", '-m "not slow"'):
        assert tool in makefile and tool in readme, tool
    assert "the whole test suite" not in readme


#: repository paths the docs may name in backticks
_PATH = re.compile(
    r"`((?:sparsec|examples|bench|tests|docs|templates|grammar|scratch)/[\w./-]*\w)`"
)


def test_docs_name_only_files_that_exist():
    """Paths in backticks, Markdown files and relative links in README.md and docs/*.md
    exist in the repository (no DESIGN.md or scratch/ script that was never committed)."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        named = [m.group(1) for m in _PATH.finditer(text)]
        named += [m.group(1) for m in re.finditer(r"\b([\w-]+\.md)\b", text)]
        linked = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
        for path in named:
            if not any((base / path).exists() for base in (ROOT, ROOT / "docs", doc.parent)):
                missing.append(f"{doc.name}: {path}")
        missing += [f"{doc.name}: {t}" for t in linked if not (doc.parent / t).exists()]
    assert not missing, missing
