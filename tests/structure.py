"""The package's shape, measured from its source: the module import graph (every import,
TYPE_CHECKING and function-local ones included), its cycles, the stage order of the folders,
and the largest modules and classes. ``python tests/structure.py`` prints the numbers;
`test_structure.py` holds the package to them."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sparsec"

#: the stages, top to bottom: a module may import its own stage and the stages below it
STAGES = (
    ("sparsec", "sparsec.cli", "sparsec.demo", "sparsec.__main__"),
    ("sparsec.distributed",),  # on Dask: parts of tensors and kernels run part by part
    ("sparsec.nn",),
    ("sparsec.api",),
    ("sparsec.runtime",),
    ("sparsec.pipeline",),
    ("sparsec.backends",),
    ("sparsec.passes",),
    ("sparsec.lower",),
    ("sparsec.policy",),
    ("sparsec.abi",),
    ("sparsec.middle",),
    ("sparsec.tensors",),
    ("sparsec.frontend",),
    ("sparsec.ir",),
    ("sparsec.errors", "sparsec.resources", "sparsec.target"),
)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    lines: int
    imports: frozenset[str]
    classes: tuple[tuple[str, int], ...]  # (name, lines)


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Module]:
    paths = sorted(PACKAGE.rglob("*.py"))
    names = {_name(p) for p in paths}
    found: dict[str, Module] = {}
    for path in paths:
        name = _name(path)
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports.update(a.name for a in node.names if a.name.startswith("sparsec"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if not base.startswith("sparsec"):
                    continue
                for alias in node.names:  # `from . import x` names a module
                    sub = f"{base}.{alias.name}"
                    imports.add(sub if sub in names else base)
        imports.discard(name)
        classes = tuple(
            (n.name, (n.end_lineno or n.lineno) - n.lineno + 1)
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef)
        )
        lines = len(path.read_text().splitlines())
        found[name] = Module(
            name, path, lines, frozenset(i for i in imports if i in names), classes
        )
    return found


def cycles(mods: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(mods[v].imports):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def stage(name: str) -> int:
    best, rank = -1, -1
    for r, prefixes in enumerate(STAGES):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), r
    return rank


def upward_imports(mods: dict[str, Module]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module's stage is above the importer's."""
    return sorted((m.name, i) for m in mods.values() for i in m.imports if stage(i) < stage(m.name))


def subpackages(mods: dict[str, Module]) -> list[str]:
    return sorted(m.name for m in mods.values() if m.path.name == "__init__.py" and "." in m.name)


#: the targets' names (`sparsec.target.TARGETS`): only the API edge reads them
TARGET_NAMES = frozenset({"c", "cuda", "cuda-emulated"})
#: where the user's ``target=`` string becomes a `sparsec.target.Target`
TARGET_EDGE = frozenset({"sparsec.api.kernel", "sparsec.cli"})


def _says_target(node: ast.AST) -> bool:
    """A name or attribute that holds a target (``target``, ``args.target``)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(node, ast.Name | ast.Attribute) and name.endswith("target")


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set literal."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def target_decisions(mods: dict[str, Module]) -> list[tuple[str, int, str]]:
    """(module, line, what) for each place outside `TARGET_EDGE` that decides by a
    target's name: a comparison (or ``match``) of something named ``*target`` with a
    string, a comparison with ``"cuda"`` or ``"cuda-emulated"``, a literal collection
    holding one (a list of targets to compare with), and a parameter ``target`` annotated
    ``str`` (a target travels as its `Target`)."""
    found: list[tuple[str, int, str]] = []
    gpu_names = TARGET_NAMES - {"c"}
    for m in mods.values():
        if m.name in TARGET_EDGE:
            continue
        for node in ast.walk(ast.parse(m.path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                strings = set().union(*map(_strings, sides))
                if strings & gpu_names or (strings and any(map(_says_target, sides))):
                    found.append((m.name, node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.Match) and _says_target(node.subject):
                found.append((m.name, node.lineno, f"match {ast.unparse(node.subject)}"))
            elif isinstance(node, ast.MatchValue) and _strings(node.value) & gpu_names:
                found.append((m.name, node.lineno, f"case {ast.unparse(node.value)}"))
            elif isinstance(node, ast.Tuple | ast.List | ast.Set) and _strings(node) & gpu_names:
                if m.name != "sparsec.target":  # where the names are defined
                    found.append((m.name, node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.arg) and node.arg == "target" and node.annotation:
                if ast.unparse(node.annotation) == "str":
                    found.append((m.name, node.lineno, "target: str"))
    return sorted(found)


def report() -> str:
    mods = modules()
    biggest = max(mods.values(), key=lambda m: m.lines)
    klass = max(((c, n, m.name) for m in mods.values() for c, n in m.classes), key=lambda t: t[1])
    lines = [
        f"modules: {len(mods)}, lines: {sum(m.lines for m in mods.values())}",
        f"subpackages: {len(subpackages(mods))} ({', '.join(subpackages(mods))})",
        f"largest module: {biggest.name} ({biggest.lines} lines)",
        f"largest class: {klass[2]}.{klass[0]} ({klass[1]} lines)",
        f"import cycles: {len(cycles(mods))} {cycles(mods)}",
        f"upward imports: {len(upward_imports(mods))} {upward_imports(mods)}",
        "modules over 450 lines: "
        + ", ".join(f"{m.name} ({m.lines})" for m in mods.values() if m.lines > 450),
        "classes over 400 lines: "
        + ", ".join(f"{m.name}.{c} ({n})" for m in mods.values() for c, n in m.classes if n > 400),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
