"""The ``sparsec`` command line.

    sparsec compile "y(i) = A(i,j) * x(j)" -f A:csr --check
    sparsec compile "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)" -f B:csf -o mttkrp.c

Every error prints a message and exits with status 2, with no traceback: a `SparsecError`
(bad input), a bad option (argparse), and also, as an internal error to report, any other
exception. ``--check`` prints one verdict line (``--print-source`` adds the kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from . import __version__
from .base.errors import SparsecError
from .base.target import TARGETS
from .base.values import TYPES
from .frontend.semantics import DIVISIONS, SEMIRINGS
from .tensors.formats import FORMAT_HELP

FORMATS_EPILOG = f"""\
formats (-f NAME:FORMAT, repeatable; unlisted tensors are dense, and with no -f at all
the highest-order input is sparse: compressed vector, csr, csf):
  {FORMAT_HELP}
  presets:  dense | csr (ds) | csc (ds:1,0) | dcsr (ss) | dcsc (ss:1,0) | coo (uq, uqq...) | csf (sss...)
  letters:  d dense, s compressed, u compressed non-unique, q singleton, p padded singleton (ddp: ELL)

examples:
  sparsec compile "y(i) = A(i,j) * x(j)" -f A:csr --check
  sparsec compile "C(i,j) = A(i,k) * B(k,j)" -f A:csr -f B:csc --dims i=300,j=200,k=100 --check
  sparsec compile "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)" -f B:sss -o mttkrp.c
  sparsec compile "a = B(i,j) * C(i,j)" -f B:coo -f C:ds:1,0
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors also exit 2, no traceback
        self.print_usage(sys.stderr)
        print(f"sparsec: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return seed


def _density(text: str) -> float:
    try:
        density = float(text)
    except ValueError:
        density = -1.0
    if not 0 <= density <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return density


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sparsec",
        description="sparsec: compile tensor index notation into sparse C kernels (after TACO).",
        epilog=FORMATS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sparsec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser(
        "compile",
        help="generate (and optionally check) the kernel for an expression",
        description="Generate the C kernel for EXPR and print it (or write it to -o FILE).",
        epilog=FORMATS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("expr", metavar="EXPR", help='index notation, e.g. "y(i) = A(i,j) * x(j)"')
    c.add_argument(
        "-f",
        "--format",
        action="append",
        default=[],
        metavar="NAME:FORMAT",
        help="storage format of one tensor (repeatable), e.g. -f A:csr -f B:ds:1,0",
    )
    c.add_argument(
        "--target",
        default="c",
        choices=list(TARGETS),
        help="c (OpenMP), cuda (a .cu kernel), or cuda-emulated (the same, run on the CPU)",
    )
    c.add_argument(
        "--verify",
        action="store_true",
        help="CUDA: compile the kernel with NVRTC (or nvcc) for sm_80 and sm_90 and print "
        "registers, spills and occupancy; needs no GPU",
    )
    c.add_argument("-o", "--output", metavar="FILE", help="write the kernel source to FILE")
    c.add_argument(
        "--check",
        action="store_true",
        help="compile, run on random inputs (with zeros, empty rows and slices) and compare "
        "with torch.einsum; prints one verdict line instead of the kernel (refused when "
        "the inputs and the dense reference would not fit in memory)",
    )
    c.add_argument(
        "--print-source",
        action="store_true",
        help="print the kernel source also with --check",
    )
    c.add_argument(
        "--density",
        type=_density,
        default=0.3,
        metavar="D",
        help="share of stored entries in --check's random sparse inputs (default 0.3)",
    )
    c.add_argument(
        "--dims",
        default="",
        metavar="i=100,j=200",
        help="extents of index variables for --check (others get small defaults)",
    )
    c.add_argument(
        "--dtype",
        default="float64",
        choices=list(TYPES),
        help="the kernel's value type (default float64; integer types and bool compute "
        "exactly, wrapping: docs/semantics.md, Value types)",
    )
    c.add_argument("--index-dtype", default="int32", choices=["int32", "int64"])
    c.add_argument(
        "--division",
        default="sparse",
        choices=list(DIVISIONS),
        help="sparse: a / b is absent where a is (the default); ieee: dense IEEE values",
    )
    c.add_argument(
        "--semiring",
        default="plus_times",
        choices=list(SEMIRINGS),
        help="the algebra of * and of implicit sums (GraphBLAS's model)",
    )
    c.add_argument(
        "--mask",
        default=None,
        metavar="M",
        help="compute only where tensor M has a stored entry (~M: where it has none)",
    )
    c.add_argument("--seed", type=_seed, default=0, help="random seed for --check inputs (>= 0)")
    c.add_argument("--serial", action="store_true", help="generate a serial kernel (no OpenMP)")
    c.add_argument(
        "-s",
        "--schedule",
        action="append",
        default=[],
        metavar="COMMAND",
        help='a scheduling command (repeatable, applied in order), e.g. -s "split(i,i0,i1,32)" '
        '-s "parallelize(i0,CPUThread,NoRaces)"',
    )
    t = sub.add_parser(
        "tune",
        help="calibrate this CPU: measure the pass options whose best value differs by CPU",
        description="Measure, on this CPU, the pass options whose best value differs "
        "between CPUs (stream and gather prefetches), and store the choices in the cache "
        "directory for this CPU; C kernels generated afterwards use them. SPARSEC_TUNE=0 "
        "makes kernels ignore the stored choices.",
    )
    t.add_argument("--show", action="store_true", help="print the stored calibration and exit")
    t.add_argument("--quiet", action="store_true", help="print nothing")
    t.add_argument("--nice", action="store_true", help="run at a lower priority")
    return parser


def _tune(args: argparse.Namespace) -> int:
    from .api.calibrate import calibrate
    from .policy import calibrated

    if args.show:
        found = calibrated.load()
        if found is None:
            print(f"no calibration for this CPU ({calibrated.path()})")
            return 1
        print(json.dumps(found, indent=1, sort_keys=True))
        return 0
    if args.nice:
        with contextlib.suppress(OSError):
            os.nice(10)
    say = (lambda _: None) if args.quiet else print
    done = calibrate(say=say)
    say(f"stored in {calibrated.path()} ({done.seconds:.1f} s)")
    return 0


def _formats(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, fmt = item.partition(":")
        if not sep or not name or not fmt:
            raise SparsecError(f"-f expects NAME:FORMAT (e.g. A:csr), got {item!r}")
        if name in out:
            raise SparsecError(f"format for {name!r} given twice")
        out[name.strip()] = fmt
    return out


def _dims(text: str) -> dict[str, int]:
    dims: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            size = int(value)
        except ValueError:
            size = -1
        if not sep or not name.strip() or size < 0:
            raise SparsecError(f"--dims expects NAME=SIZE pairs like i=100,j=200, got {part!r}")
        dims[name.strip()] = size
    return dims


def _compile(args: argparse.Namespace) -> int:
    from .api.kernel import kernel

    if args.serial and args.schedule:
        raise SparsecError("--serial and -s/--schedule exclude each other")
    semantics = {"division": args.division, "semiring": args.semiring, "mask": args.mask}
    k = kernel(
        args.expr,
        _formats(args.format),
        target=args.target,
        schedule="serial" if args.serial else (args.schedule or None),
        dtype=args.dtype,
        index_dtype=args.index_dtype,
        **semantics,
    )
    source = k.source
    if args.output:
        try:
            Path(args.output).write_text(source)
        except OSError as err:
            raise SparsecError(f"cannot write {args.output}: {err.strerror}") from None
    elif args.print_source or not args.check:
        sys.stdout.write(source)
    if args.verify:
        if args.target == "c":
            raise SparsecError("--verify compiles CUDA: use it with --target cuda")
        for report in k.verify():
            print(f"verify: ok: {report}")
            if report.spills:
                raise SparsecError(f"the kernel spills registers on {report.arch}")
    if args.check:
        from .api import footprint

        dims = k.extents(_dims(args.dims))
        shown = ",".join(f"{i}={n}" for i, n in dims.items())
        parts = footprint.check_parts(k.spec, dims, density=args.density)
        footprint.ensure_fits(parts, f"--check of {k.assignment} at {shown}")
        if args.target == "cuda":
            # no GPU needed: the same source runs through the CUDA emulation on the CPU
            k = kernel(
                args.expr,
                _formats(args.format),
                target="cuda-emulated",
                schedule=args.schedule or None,
                dtype=args.dtype,
                index_dtype=args.index_dtype,
                **semantics,
            )
        inputs, _ = k.random_inputs(dims, seed=args.seed, density=args.density)
        result = k.check(**inputs)
        print(
            f"check: ok: {k.assignment} matches {result.reference} on random inputs ({shown}; "
            + ("run by the CUDA emulation on the CPU; " if k.platform.emulated else "")
            + f"max abs error {result.max_abs_error:.3g}, {result.dtype})"
        )
    return 0


#: the keyword arguments of `sparsec.kernel` that errors suggest, as this CLI spells them
_OPTIONS = {
    "dtype": "--dtype",
    "index_dtype": "--index-dtype",
    "target": "--target",
    "schedule": "-s",
    "division": "--division",
    "semiring": "--semiring",
    "mask": "--mask",
}
_KEYWORD = re.compile(rf"\b({'|'.join(_OPTIONS)})='([^']*)'")


def cli_spelling(message: str) -> str:
    """An error's suggestions as this command line takes them: the library's messages name
    `sparsec.kernel`'s keywords (``dtype='float32'``), the CLI's options (``--dtype
    float32``); a schedule is quoted for the shell."""

    def option(m: re.Match[str]) -> str:
        value = m.group(2)
        return f"{_OPTIONS[m.group(1)]} {repr(value) if ' ' in value else value}"

    return _KEYWORD.sub(option, message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _tune(args) if args.command == "tune" else _compile(args)
    except SparsecError as err:
        print(f"sparsec: error: {cli_spelling(str(err))}", file=sys.stderr)
        return 2
    except RecursionError:
        print("sparsec: error: expression is too deeply nested", file=sys.stderr)
        return 2
    except MemoryError:
        print("sparsec: error: out of memory; use smaller --dims", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - the contract: a message and status 2, always
        print(
            f"sparsec: internal error: {type(err).__name__}: {err}\n"
            "this is a bug in sparsec; please report it with the command line",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
