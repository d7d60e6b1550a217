"""The host's facts, read in one place: caches, cores, vector width, CPU flags, the
compiler's target, and how busy the cores are with other work.

Every decision sparsec derives from the machine it runs on (the panel, band and depth cost
models, the output size from which tiles are stored non-temporally, the row strides whose
gathers are not prefetched into L1, a default call's thread
count, the compile cache's key) asks `machine()`, never sysfs or ``os.cpu_count`` itself, so
one setting changes them all:

- ``SPARSEC_MACHINE`` overrides facts for a whole process, e.g.
  ``SPARSEC_MACHINE="l2=1M,l3=32M,cores=16,vector=64"`` (keys below; a fact not named is
  the host's). ``make test`` under it runs the suite as on that machine.
- `use` does the same for a block of code (tests): ``with use(l2=256 << 10): ...``, or
  ``with use(MACHINE): ...`` for a whole `Machine`.

Keys of ``SPARSEC_MACHINE``: ``l2`` (the cache private to a core, bytes, with an optional
K/M/G suffix), ``l3`` (the last-level cache), ``cores``, ``vector`` (bytes per SIMD
register: 16, 32 for AVX2, 64 for AVX-512), ``flags`` (CPU flags joined by ``+``),
``target`` (a name for what ``-march=native`` resolves to) and ``busy`` (cores busy with
other work; fixed instead of measured, ``busy=0`` turns the load adaptation off), ``memory``,
``half`` (the 16-bit value dtypes the C compiler supports, joined by ``+``: ``float16``,
``bfloat16``; ``half=none`` for neither; by default the compiler is asked, `c_half_types`),
``l1way`` (one way of the L1 data cache, its size over its ways, in bytes with K/M/G),
``l1`` (the L1 data cache, bytes).

The simulated facts steer sparsec's decisions only: kernels are still compiled for, and run
on, the real CPU (the compile cache's key holds what the compiler really targets).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import MachineError
from .compiler import HALF_PROBES, native_target, probe_half
from .compiler import compiler_target as compiler_target  # re-exported: build and tests use it

#: the environment variable that overrides the host's facts
ENV = "SPARSEC_MACHINE"


#: the L1 data cache, and one way of it, where the host does not say: 32 KB in 8 ways, as
#: on most x86 cores
DEFAULT_L1_DATA = 32 << 10
DEFAULT_L1_WAY = 4 << 10


@dataclass(frozen=True, slots=True)
class Machine:
    """What sparsec's decisions may know about the machine."""

    #: bytes of the cache private to a core (its L2)
    core_cache: int
    #: bytes of the last-level cache
    last_level_cache: int
    #: cores this process may run on (affinity and cgroup quota applied)
    cores: int
    #: bytes per SIMD register of the native target: 16 (SSE, NEON), 32 (AVX2), 64 (AVX-512)
    vector_bytes: int
    #: the CPU's feature flags (``/proc/cpuinfo``)
    flags: frozenset[str]
    #: what ``-march=native`` resolves to (``znver3``), else the architecture's name
    target: str
    #: cores busy with other work; None: measured while sparsec runs (`busy`)
    busy: float | None = None
    #: bytes of physical memory (what a dense conversion may use a share of); None: unknown
    memory: int | None = None
    #: the 16-bit value dtypes the C compiler has types for; None: ask it (`c_half_types`)
    half: frozenset[str] | None = None
    #: bytes of one way of the core's L1 data cache (its size over its ways): addresses this
    #: far apart share its sets (`sc_prefetch_row` in the kernel template)
    l1_way: int = DEFAULT_L1_WAY
    #: bytes of the core's L1 data cache (`costs.column_block`)
    l1_data: int = DEFAULT_L1_DATA


#: the fields of a `Machine` by their ``SPARSEC_MACHINE`` keys
_KEYS = {
    "l2": "core_cache",
    "l3": "last_level_cache",
    "llc": "last_level_cache",
    "cores": "cores",
    "vector": "vector_bytes",
    "flags": "flags",
    "target": "target",
    "busy": "busy",
    "memory": "memory",
    "half": "half",
    "l1way": "l1_way",
    "l1": "l1_data",
}
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: assumed when the host does not say (no sysfs): a small machine's caches
DEFAULT_CORE_CACHE = 512 << 10
DEFAULT_LAST_LEVEL_CACHE = 8 << 20


def machine() -> Machine:
    """The machine decisions are made for: the innermost `use`, else ``SPARSEC_MACHINE``
    over the host's facts, else the host's (both read once per process)."""
    if _overrides:
        return _overrides[-1]
    return _configured()


@functools.cache
def _configured() -> Machine:
    """The host's facts under ``SPARSEC_MACHINE``, read once per process (like OpenMP's
    environment): a call asks for the machine, and reading the environment would cost
    it microseconds."""
    text = os.environ.get(ENV, "")
    return parse(text, host()) if text.strip() else host()


@functools.cache
def host() -> Machine:
    """The host's own facts, read once per process."""
    cpus = _cpus()
    flags = _cpu_flags()
    core, last, l1_way, l1_data = _caches(min(cpus) if cpus else 0)
    _meter()  # the first reading of the load, so the first call finds a window to measure
    return Machine(
        core_cache=core,
        last_level_cache=last,
        cores=_quota(len(cpus) or os.cpu_count() or 1),
        vector_bytes=_vector_bytes(flags),
        flags=flags,
        target=native_target(),
        l1_way=l1_way,
        l1_data=l1_data,
        memory=(
            os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            if "SC_PHYS_PAGES" in getattr(os, "sysconf_names", ())
            else None
        ),
    )


def parse(text: str, base: Machine | None = None) -> Machine:
    """``base`` (the host's facts when None) with the facts ``text`` names, in
    ``SPARSEC_MACHINE``'s syntax: ``key=value`` pairs separated by commas."""
    facts: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or key not in _KEYS:
            raise MachineError(
                f"{ENV}: cannot read {item.strip()!r}; write key=value pairs separated by "
                f"commas, with keys {', '.join(_KEYS)} (e.g. l2=1M,l3=32M,cores=16,vector=64)"
            )
        facts[_KEYS[key]] = _value(_KEYS[key], value)
    return _replace(base or host(), facts)


@contextlib.contextmanager
def use(base: Machine | str | None = None, /, **facts: Any) -> Iterator[Machine]:
    """Make decisions for another machine inside the block: ``base`` (a `Machine`, or text
    in ``SPARSEC_MACHINE``'s syntax over the current machine) with the keyword ``facts``
    (`Machine`'s field names) replaced. Blocks nest; the machine is the process's, not the
    thread's (kernels run panels on worker threads)."""
    if isinstance(base, str):
        base = parse(base, machine())
    global epoch
    chosen = _replace(base or machine(), facts)
    with _lock:
        _overrides.append(chosen)
        epoch += 1
    try:
        yield chosen
    finally:
        with _lock:  # this block's entry (another thread's block may have ended first)
            at = max(i for i, m in enumerate(_overrides) if m is chosen)
            del _overrides[at]
            epoch += 1


_overrides: list[Machine] = []
_lock = threading.Lock()
#: counts the changes of `machine()` by `use`, so a caller that keeps a value derived from
#: the machine can tell it is stale with one comparison
epoch = 0


def _replace(base: Machine, facts: dict[str, Any]) -> Machine:
    fields = {f.name for f in dataclasses.fields(Machine)}
    unknown = set(facts) - fields
    if unknown:
        raise MachineError(
            f"unknown machine facts {sorted(unknown)}; the facts are {sorted(fields)}"
        )
    for name, value in facts.items():
        if isinstance(value, str):
            facts[name] = _value(name, value)
        elif name in ("flags", "half"):
            facts[name] = frozenset(value)
    made = dataclasses.replace(base, **facts)
    # every integer fact is positive (memory may be unknown)
    positive = [f.name for f in dataclasses.fields(Machine) if f.type in ("int", "int | None")]
    for name in (n for n in positive if getattr(made, n) is not None):  # memory: unknown
        value = getattr(made, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MachineError(f"machine fact {name} must be a positive integer, not {value!r}")
    if made.busy is not None and not (isinstance(made.busy, int | float) and made.busy >= 0):
        raise MachineError(f"machine fact busy must be a number >= 0, not {made.busy!r}")
    return made


def _value(name: str, text: str) -> Any:
    """A fact's value from its text."""
    if name == "flags":
        return frozenset(f for f in text.replace(" ", "+").split("+") if f)
    if name == "half":
        found = frozenset(f for f in text.replace(" ", "+").split("+") if f and f != "none")
        if found - set(HALF_PROBES):
            raise MachineError(f"{ENV}: half names {' and '.join(HALF_PROBES)}, not {text!r}")
        return found
    if name == "target":
        return text
    if name == "busy":
        try:
            return float(text)
        except ValueError:
            raise MachineError(f"{ENV}: busy must be a number of cores, not {text!r}") from None
    if name == "vector_bytes":
        text = {"sse": "16", "neon": "16", "avx2": "32", "avx512": "64"}.get(text.lower(), text)
    upper = text.upper().removesuffix("IB").removesuffix("B")
    digits, suffix = (upper[:-1], upper[-1]) if upper[-1:] in "KMG" else (upper, "")
    if not digits.isdigit() or (suffix and name in ("cores", "vector_bytes")):
        raise MachineError(
            f"{ENV}: {name} must be a whole number"
            + (" of bytes with an optional K, M or G suffix" if "cache" in name else "")
            + f", not {text!r}"
        )
    return int(digits) * _SCALE[suffix]


# ------------------------------------------------------------------------ the host


def _cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def _quota(cpus: int) -> int:
    """``cpus`` less what a cgroup CPU quota leaves (cgroup v2, then v1)."""
    limit = cpus
    for path, period_path in (
        ("/sys/fs/cgroup/cpu.max", None),
        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
    ):
        try:
            parts = Path(path).read_text().split()
            if period_path is not None:
                parts.append(Path(period_path).read_text().strip())
            quota, period = int(parts[0]), int(parts[1])
        except (OSError, ValueError, IndexError):
            continue  # "max": no quota
        if quota > 0 and period > 0:
            limit = min(limit, max(1, math.ceil(quota / period)))
    return limit


def _caches(cpu: int) -> tuple[int, int, int, int]:
    """(the core's L2, the last-level cache, one way of its L1 data cache, that cache) of
    ``cpu`` in bytes, from Linux sysfs."""
    sizes: dict[int, int] = {}
    l1_way, l1_data = DEFAULT_L1_WAY, DEFAULT_L1_DATA
    root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache")
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        entries = []
    for entry in entries:
        try:
            level = int((entry / "level").read_text())
            kind = (entry / "type").read_text().strip()
            size = _value("core_cache", (entry / "size").read_text().strip())
        except (OSError, ValueError, MachineError):
            continue
        if kind != "Instruction":
            sizes[level] = max(size, sizes.get(level, 0))
        if level == 1 and kind == "Data":
            l1_data = size
            try:
                l1_way = size // int((entry / "ways_of_associativity").read_text()) or l1_way
            except (OSError, ValueError, ZeroDivisionError):
                pass
    core = sizes.get(2, DEFAULT_CORE_CACHE)
    last = sizes[max(sizes)] if sizes and max(sizes) >= 2 else DEFAULT_LAST_LEVEL_CACHE
    return core, last, l1_way, l1_data


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _vector_bytes(flags: frozenset[str]) -> int:
    """The register width ``-march=native`` vectorises with (the kernel template's
    ``SC_VBYTES``)."""
    if "avx512f" in flags:
        return 64
    if "avx" in flags:
        return 32
    return 16


# ------------------------------------------------------------------------ 16-bit values


def c_half_types(on: Machine | None = None) -> frozenset[str]:
    """The 16-bit value dtypes (``float16``, ``bfloat16``) that C kernels can store: the
    machine's ``half`` fact when set, else what the C compiler (``SPARSEC_CC``) compiles,
    asked once per process."""
    given = (on or machine()).half
    if given is not None:
        return given
    cc = tuple(shlex.split(os.environ.get("SPARSEC_CC", "cc"))) or ("cc",)
    return probe_half(cc)


# ------------------------------------------------------------------------ the load

#: seconds between two readings of the cores' busy time (the kernel counts it in ticks of
#: a hundredth of a second per core, so a shorter window mostly measures rounding)
LOAD_INTERVAL_S = 0.1
#: weight of the newest reading in the estimate; the rest is the previous estimate, so two
#: processes that each adapt to the other settle on a share instead of taking turns
LOAD_WEIGHT = 0.5


def _read_stat(cpus: frozenset[int]) -> tuple[int, int] | None:
    """(busy, total) ticks of ``cpus`` since boot, from ``/proc/stat``; None off Linux."""
    busy = total = 0
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.split(b"\n"):
        if not line.startswith(b"cpu") or line[3:4] == b" ":
            continue
        name, *ticks = line.split()
        if not name[3:].isdigit() or int(name[3:]) not in cpus or len(ticks) < 4:
            continue
        counts = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
        idle = counts[3] + (counts[4] if len(counts) > 4 else 0)
        total += sum(counts)
        busy += sum(counts) - idle
    return (busy, total) if total else None


class LoadMeter:
    """Cores busy with work other than this process's, estimated from the CPUs' busy ticks
    (``/proc/stat``) less this process's own CPU time (every thread's, OpenMP's spinning
    workers included) between readings at least `LOAD_INTERVAL_S` apart. A call asks for
    the estimate; it reads the counters only when the last reading is that old, so a call
    pays a clock read, not a file read."""

    def __init__(
        self,
        read: Callable[[frozenset[int]], tuple[int, int] | None] = _read_stat,
        clock: Callable[[], float] = time.monotonic,
        own: Callable[[], float] = time.process_time,
    ) -> None:
        self._read, self._clock, self._own = read, clock, own
        self._cpus = _cpus()
        self._lock = threading.Lock()
        self.estimate = 0.0
        self._last: tuple[float, float, tuple[int, int]] | None = None
        self._due = 0.0
        self._take()

    def busy(self) -> float:
        if self._clock() >= self._due and self._lock.acquire(blocking=False):
            try:
                self._take()
            finally:
                self._lock.release()
        return self.estimate

    def _take(self) -> None:
        now, own = self._clock(), self._own()
        ticks = self._read(self._cpus)
        self._due = now + LOAD_INTERVAL_S
        if ticks is None:
            return
        last, self._last = self._last, (now, own, ticks)
        if last is None or own < last[1]:
            return  # the first reading, or the first in a forked child (its CPU time restarts)
        wall = now - last[0]
        busy, total = ticks[0] - last[2][0], ticks[1] - last[2][1]
        if wall <= 0 or total <= 0:
            self._last = last  # no time passed on the counters: keep the older reading
            return
        cores = len(self._cpus) * busy / total
        others = min(max(cores - (own - last[1]) / wall, 0.0), float(len(self._cpus)))
        self.estimate = LOAD_WEIGHT * others + (1 - LOAD_WEIGHT) * self.estimate


@functools.cache
def _meter() -> LoadMeter:
    return LoadMeter()


def busy(on: Machine | None = None) -> float:
    """Cores busy with other work: the machine's ``busy`` fact when set, else measured."""
    fixed = (on or machine()).busy
    return _meter().busy() if fixed is None else fixed


def threads_for(configured: int, cores: int, busy: float) -> int:
    """Threads for a default call: ``configured`` on a quiet machine; with ``busy`` of the
    ``cores`` taken by other work, no more than the cores left (at least one). A thread
    more than the free cores is descheduled mid-call, and the call's other threads then
    wait for it at the closing barrier for a whole time slice of the other work, many times
    the call's one-thread time, where the cores left finish it at about that time
    (docs/decisions.md, "A default call leaves busy cores alone")."""
    free = cores - math.floor(busy + 0.5)
    if free >= cores:
        return configured
    return max(1, min(configured, free))
