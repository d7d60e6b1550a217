"""Locate the data directories (``grammar/``, ``templates/``) in a wheel or a checkout,
and the cache directory sparsec writes to.

A wheel carries them inside the package (hatchling ``force-include``); a source checkout
keeps them at the repository's top level, beside ``sparsec/``. The cache directory is
``SPARSEC_CACHE_DIR``, else the user cache directory (``~/.cache/sparsec`` on Linux).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"sparsec data directory {name!r} is missing from the installation")


def cache_dir() -> Path:
    """Where compiled kernels (and the parser's tables) are cached."""
    env = os.environ.get("SPARSEC_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("sparsec"))
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return Path.home() / ".cache" / "sparsec"
