"""Locate the data directories (``grammar/``, ``templates/``) in a wheel or a checkout,
and the cache directory sparsec writes to.

A wheel carries them inside the package (hatchling ``force-include``); a source checkout
keeps them at the repository's top level, beside ``sparsec/``. The cache directory is
``SPARSEC_CACHE_DIR``, else the user cache directory (``~/.cache/sparsec`` on Linux).
Processes share it: every entry is written whole by an atomic rename and checked by a
digest when read (`write_entry`, `read_entry`; compiled libraries: `sparsec.runtime.build`),
so a partial or corrupt entry is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent  # the package, above base/


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


#: the first line of a cache entry `write_entry` writes: a tag, then the payload's SHA-256
_ENTRY_TAG = b"sparsec-cache-entry 1 "


def write_entry(path: Path, payload: bytes) -> bool:
    """Write a cache entry atomically: a temporary file in the same directory, headed by
    the payload's digest, renamed over ``path`` (``os.replace``), so a reader sees a whole
    entry of some writer or none, never a mix of two processes' bytes. False (and nothing
    left behind) where the directory cannot be written: a cache is only an optimisation."""
    digest = hashlib.sha256(payload).hexdigest().encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_ENTRY_TAG + digest + b"\n" + payload)
        os.replace(tmp, path)
        return True
    except OSError:
        return False
    finally:  # after a rename there is nothing to remove; after a failed write, the file
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_entry(path: Path) -> bytes | None:
    """The payload of a whole cache entry `write_entry` wrote, or None where ``path`` is
    missing, unreadable, truncated, corrupt or not such an entry (the caller rebuilds)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head, sep, payload = data.partition(b"\n")
    if not sep or not head.startswith(_ENTRY_TAG):
        return None
    if hashlib.sha256(payload).hexdigest().encode() != head[len(_ENTRY_TAG) :]:
        return None
    return payload
