"""The host's calibration, stored: the pass options that short measurements on this CPU
chose (`sparsec.api.calibrate` measures; ``sparsec tune`` runs it), read by `decide` for
every C kernel. Like FFTW's wisdom, a calibration belongs to one CPU: it is stored in the
cache directory under a key of the machine's resolved target and CPU model, so a cache
shared by two kinds of CPU keeps one file for each.

- ``SPARSEC_TUNE=0`` turns calibration off: kernels use the defaults (`DEFAULTS`, safe on
  every CPU measured) and nothing runs in the background. The tests set it.
- Otherwise the first C kernel of a process on a host with no calibration starts
  ``sparsec tune`` in a background process (once per host and hour, a lock file guards
  it) and uses the defaults; kernels generated after the file appears use its choices.
- A missing, unreadable, corrupt, foreign (another CPU's key) or outdated (another
  `VERSION`, an option or value this sparsec does not tune) file is no calibration: the
  defaults again, never an error.

Only the options in `CHOICES` are calibrated, each to one of its listed values; the
file names the value chosen and the times that chose it, for the notes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..base.resources import cache_dir, read_entry, write_entry
from .machine import Machine, machine

#: the environment variable: ``0`` (or ``off``) turns calibration off
ENV = "SPARSEC_TUNE"
#: the file format's version; a file of another is ignored
VERSION = 3
#: each calibrated option and the values measured for it, the default first: a
#: `PassOptions` field (``tile.`` for its `TileOptions`), which the kernel's code depends
#: on, or a threshold of the runtime's cost models (``costs.``: `policy.costs`), which a
#: call's layout depends on
CHOICES: dict[str, tuple[Any, ...]] = {
    "stream_locality": (3, 0, None),
    "stream_lines": (2, 1),
    "reassociate": (False, True),
    "tile.prefetch_distance": (6, 0, 12),
    "costs.panel_min_bytes": (4 << 20, 1 << 20),
    "costs.panel_min_reuse": (48, 24),
    "costs.panel_fit": (False, True),
    "costs.panels_in_sequence": (False, True),
}
#: seconds a background calibration's lock holds before another process may start one
LOCK_S = 3600.0


def enabled() -> bool:
    """Whether calibration is on (``SPARSEC_TUNE`` is not ``0``/``off``/``no``)."""
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "no", "false")


def key(on: Machine | None = None) -> str:
    """The calibration's key for ``on`` (the current machine): its resolved target and a
    digest of its CPU model and flags (two CPUs of one target name differ in caches)."""
    m = on or machine()
    return _key(m.target, m.flags)


@functools.cache
def _key(march: str, flags: frozenset[str]) -> str:
    """`key`, computed once per target and flags (every decision and wide call asks)."""
    model = _model_name()
    digest = hashlib.sha256(f"{model}|{' '.join(sorted(flags))}".encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in march) or "unknown"
    return f"{safe}-{digest}"


def path(on: Machine | None = None) -> Path:
    """Where ``on``'s calibration is stored."""
    return cache_dir() / "calibration" / f"{key(on)}.json"


def save(chosen: dict[str, Any], measured: dict[str, Any], on: Machine | None = None) -> Path:
    """Store ``chosen`` (option -> value, each from `CHOICES`) with the times that chose
    it, whole (an atomic rename); returns the path."""
    for name, value in chosen.items():
        if not is_choice(name, value):
            raise ValueError(f"{name}={value!r} is not a calibrated choice")
    payload = {
        "version": VERSION,
        "key": key(on),
        "cpu": _model_name(),
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "options": chosen,
        "measured": measured,
    }
    where = path(on)
    write_entry(where, json.dumps(payload, indent=1, sort_keys=True).encode())
    _cache.clear()
    return where


def load(on: Machine | None = None) -> dict[str, Any] | None:
    """The stored calibration of ``on`` (its whole payload), or None where there is none
    that this sparsec can use (see the module's docstring)."""
    data = read_entry(path(on))
    if data is None:
        return None
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("version") != VERSION:
        return None
    options = payload.get("options")
    if payload.get("key") != key(on) or not isinstance(options, dict):
        return None
    if not all(is_choice(n, v) for n, v in options.items()):
        return None
    return payload


def is_choice(name: str, value: Any) -> bool:
    """Whether ``value`` is one of option ``name``'s values, of its type too (JSON's
    ``false`` is no hint 0, and a hint printed as ``False`` would not compile)."""
    return name in CHOICES and any(type(value) is type(c) and value == c for c in CHOICES[name])


def pass_options(on: Machine | None = None) -> dict[str, Any]:
    """The calibrated `PassOptions` fields (`overrides` less the cost models')."""
    return {k: v for k, v in overrides(on).items() if not k.startswith("costs.")}


def cost(name: str, default: Any) -> Any:
    """The cost models' threshold ``name`` (``costs.NAME`` in `CHOICES`) on this host:
    calibrated, else ``default``."""
    found = overrides()
    return found.get(f"costs.{name}", default) if found else default


@contextlib.contextmanager
def trying(values: dict[str, Any]) -> Iterator[None]:
    """Make ``values`` (options of `CHOICES`) this process's calibration inside the block,
    whatever is stored and even where calibration is off: a probe measures a value this
    way, and a test sets one."""
    _trials.append(dict(values))
    try:
        yield
    finally:
        _trials.pop()


_trials: list[dict[str, Any]] = []


def overrides(on: Machine | None = None) -> dict[str, Any]:
    """The calibrated options for ``on`` (option -> value), ``{}`` where calibration is off
    or not stored yet (then a background calibration is started, once). Read from disk at
    most once per `_RECHECK_S` per key, so a kernel pays a dictionary lookup. Inside
    `trying`, its values."""
    if _trials:
        return _trials[-1]
    if not enabled():
        return {}
    m = on or machine()
    k = key(m)
    now = time.monotonic()
    found = _cache.get(k)
    if found is not None and (found[1] or now - found[0] < _RECHECK_S):
        return found[1]
    payload = load(m)
    chosen: dict[str, Any] = dict(payload["options"]) if payload else {}
    _cache[k] = (now, chosen)
    if payload is None:
        start_background(m)
    return chosen


#: seconds between two looks for a calibration that was missing
_RECHECK_S = 5.0
_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_started: set[str] = set()
_lock = threading.Lock()


def start_background(on: Machine | None = None) -> bool:
    """Start ``sparsec tune`` in a detached, low-priority process for ``on``'s key, unless
    this process or another (within `LOCK_S`, by the lock file) already did; True when
    started. The child runs with calibration off for its own kernels."""
    m = on or machine()
    k = key(m)
    with _lock:
        if k in _started:
            return False
        _started.add(k)
    lock = path(m).with_suffix(".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > LOCK_S:
                lock.unlink()
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
    except OSError:
        return False  # another process holds it, or the cache cannot be written
    env = {**os.environ, ENV: "0"}
    try:
        subprocess.Popen(
            [sys.executable, "-m", "sparsec", "tune", "--quiet", "--nice"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    return True


@functools.cache
def _model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else empty."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "CPU part"):
                    return value.strip()
    except OSError:
        pass
    return ""
