"""Every ```python block of README.md runs as written (issue 36: a doc example that does not
run is a failing test).

The rule the README's blocks follow: a block runs in a fresh namespace shared only with the
blocks before it under the same heading (any level), so a block may use the names that an
earlier block of its own section defined, and nothing else; each section's first block
imports what it uses and builds its own (small) data. Blocks run in a subprocess per
section, from a temporary directory, so a block's files and threads do not outlive it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_HEADING = re.compile(r"^#{1,6} ")


def sections() -> list[tuple[str, list[str]]]:
    """(heading, its python blocks in order) for every heading that has one."""
    found: dict[str, list[str]] = {}
    heading, block, lines = "(top)", None, README.read_text().splitlines()
    for line in lines:
        if block is not None:
            if line.strip() == "```":
                found.setdefault(heading, []).append("\n".join(block))
                block = None
            else:
                block.append(line)
        elif line.strip() == "```python":
            block = []
        elif _HEADING.match(line):
            heading = line.lstrip("#").strip()
    return list(found.items())


def test_the_readme_has_python_blocks_and_keeps_its_first_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None and first.group(1).splitlines() == ["make demo", "make test"]
    assert sum(len(blocks) for _, blocks in sections()) >= 7


@pytest.mark.parametrize(("heading", "blocks"), sections(), ids=[h for h, _ in sections()])
def test_every_readme_python_block_runs(heading, blocks, tmp_path):
    if heading == "On a cluster: `sparsec.distributed`":
        pytest.importorskip("distributed")
    program = "\n".join(
        f"exec(compile({block!r}, 'README.md: {heading}, block {n + 1}', 'exec'), ns)"
        for n, block in enumerate(blocks)
    )
    run = subprocess.run(
        [sys.executable, "-c", f"ns = {{'__name__': '__readme__'}}\n{program}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert run.returncode == 0, f"README section {heading!r}:\n{run.stdout}\n{run.stderr}"
