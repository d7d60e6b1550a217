"""The C compiler's facts, asked of the compiler itself: what ``-march=native`` resolves to,
the target a set of flags compiles for, and which 16-bit floating-point types it has.
Read through `sparsec.policy.machine` (the one place host facts come from), which caches
and overrides them."""

from __future__ import annotations

import functools
import os
import platform
import shlex
import shutil
import subprocess


def native_target() -> str:
    """What ``-march=native`` resolves to for the default compiler, else the
    architecture's name."""
    cc = tuple(shlex.split(os.environ.get("SPARSEC_CC", "cc"))) or ("cc",)
    resolved = compiler_target(cc, ("-march=native",))
    for i, token in enumerate(resolved):
        if token.startswith("-march="):
            return token.removeprefix("-march=")
        if token == "-target-cpu" and i + 1 < len(resolved):
            return resolved[i + 1]
    return platform.machine() or "unknown"


#: cc1 options (gcc) and -cc1 options (clang) whose value is the next token and names the
#: target: gcc's cache sizes, clang's CPU, tuning and features
_TARGET_PAIRS = frozenset({"--param", "-target-cpu", "-tune-cpu", "-target-feature", "-triple"})


@functools.cache
def compiler_target(cc: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """The target ``cc`` compiles for under ``flags``, as the compiler resolves it: the
    ``-m`` options and target parameters of its compiler proper (``cc -###``), so
    ``-march=native`` shows as ``-march=znver3 -mavx2 ... -mtune=znver3``. Empty when the
    compiler cannot say. Runs the driver once per process and (compiler, flags); it
    compiles nothing."""
    if shutil.which(cc[0]) is None:
        return ()
    cmd = [*cc, *flags, "-###", "-x", "c", "-c", os.devnull, "-o", os.devnull]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    for line in (out.stderr + out.stdout).splitlines():
        try:
            tokens = shlex.split(line)
        except ValueError:
            continue
        if not tokens or not (tokens[0].endswith("cc1") or "-cc1" in tokens):
            continue
        found: list[str] = []
        pair = False
        for token in tokens[1:]:
            if pair:
                found.append(token)
                pair = False
            elif token in _TARGET_PAIRS:
                found.append(token)
                pair = True
            elif token.startswith("-m"):
                found.append(token)
        return tuple(found)
    return ()


#: per 16-bit value dtype, the C compiler's type for it (its storage type on the C target)
C_HALF_TYPES = {"float16": "_Float16", "bfloat16": "__bf16"}
#: per 16-bit value dtype, a translation unit that compiles where the C compiler has a
#: type for it with conversions to and from float (GCC 12 has _Float16 on x86-64 but a
#: __bf16 without conversions, which came in GCC 13)
HALF_PROBES = {
    "float16": "_Float16 sc_to(float x) { return (_Float16)x; }\n"
    "float sc_from(_Float16 x) { return (float)x; }\n",
    "bfloat16": "__bf16 sc_to(float x) { return (__bf16)x; }\n"
    "float sc_from(__bf16 x) { return (float)x; }\n",
}


@functools.cache
def probe_half(cc: tuple[str, ...]) -> frozenset[str]:
    """The names of `HALF_PROBES` whose unit ``cc`` compiles (once per process and cc)."""
    if shutil.which(cc[0]) is None:
        return frozenset()
    found = set()
    for name, source in HALF_PROBES.items():
        cmd = [*cc, "-x", "c", "-c", "-", "-o", os.devnull]
        try:
            done = subprocess.run(
                cmd, input=source, capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            found.add(name)
    return frozenset(found)
