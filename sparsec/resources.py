"""Locate the data directories (``grammar/``, ``templates/``) in a wheel or a checkout.

A wheel carries them inside the package (hatchling ``force-include``); a source checkout
keeps them at the repository's top level, beside ``sparsec/``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"sparsec data directory {name!r} is missing from the installation")
