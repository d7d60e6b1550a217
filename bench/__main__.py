"""``python -m bench [SUITE ...] [options]``: run the named suites (all when none is named).

Options after the suite names (``--quick``, ``--threads N``) are passed to every suite.
``python -m bench --list`` prints the registry.
"""

from __future__ import annotations

import importlib
import sys

from . import SUITES


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
    status = 0
    for name in names or list(SUITES):
        module = importlib.import_module(SUITES[name][0])
        status = max(status, module.main(args))
    return status


if __name__ == "__main__":
    sys.exit(main())
