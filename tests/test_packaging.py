"""A non-editable install must carry the grammar and the templates inside the package."""

from __future__ import annotations

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
