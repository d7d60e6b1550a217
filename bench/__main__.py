"""``python -m bench [SUITE ...] [options]``: run the named suites (all when none is named).

Options after the suite names (``--quick``, ``--threads N``) are passed to every suite. A
timed run (not ``--quick``) first calibrates the host where it has no stored calibration
(``sparsec tune``), so kernels use its choices and no calibration runs beside the timings.
``python -m bench --list`` prints the registry.
"""

from __future__ import annotations

import importlib
import sys

from . import SUITES
from .common import calibrate_first


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--list"], ["-l"]):
        for name, (module, about) in SUITES.items():
            print(f"{name:10s} {module:20s} {about}")
        return 0
    if args[:1] in (["--help"], ["-h"]):
        print(__doc__.strip())
        print("suites: " + ", ".join(SUITES))
        return 0
    names = []
    while args and not args[0].startswith("-"):
        name = args.pop(0)
        if name not in SUITES:
            print(f"unknown suite {name!r}; known: {', '.join(SUITES)}", file=sys.stderr)
            return 2
        names.append(name)
    if "--quick" not in args:  # a timed run uses the host's calibration, made beforehand
        calibrate_first()
    status = 0
    for name in names or list(SUITES):
        module = importlib.import_module(SUITES[name][0])
        status = max(status, module.main(args))
    return status


if __name__ == "__main__":
    sys.exit(main())
