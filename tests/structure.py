"""The package's shape, measured from its source: the module import graph (every import,
TYPE_CHECKING and function-local ones included), its cycles, the stage order of the folders,
and the largest modules and classes with the reasons they give for their length.
``python tests/structure.py`` prints the numbers; `test_structure.py` holds the package to
them."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sparsec"

#: a module or class past its soft limit says why in a string assigned to ``__long__`` in its
#: body (the module's top level, the class's body); none may pass its hard limit
SOFT_MODULE_LINES, HARD_MODULE_LINES = 450, 800
SOFT_CLASS_LINES, HARD_CLASS_LINES = 400, 600

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
    ("sparsec.base",),
)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    lines: int
    imports: frozenset[str]
    classes: tuple[tuple[str, int], ...]  # (name, lines)
    long: str | None = None  # the module's ``__long__``: why it needs its length
    long_classes: tuple[tuple[str, str], ...] = ()  # (class, its ``__long__``)


def _long(body: list[ast.stmt]) -> str | None:
    """The string a body assigns to ``__long__``, if any."""
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and [t.id for t in stmt.targets if isinstance(t, ast.Name)] == ["__long__"]
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            return stmt.value.value
    return None


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
        long_classes = tuple(
            (n.name, reason)
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and (reason := _long(n.body)) is not None
        )
        found[name] = Module(
            name,
            path,
            lines,
            frozenset(i for i in imports if i in names),
            classes,
            _long(tree.body),
            long_classes,
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


def folder(mods: dict[str, Module], name: str) -> str:
    """A module's folder: its package (the root package's modules are folder ``sparsec``)."""
    return name if mods[name].path.name == "__init__.py" else name.rpartition(".")[0]


def folder_graph(mods: dict[str, Module]) -> dict[str, Module]:
    """The folders as modules of a graph: a folder imports the folders its modules import."""
    edges: dict[str, set[str]] = {folder(mods, m): set() for m in mods}
    for m in mods.values():
        for i in m.imports:
            if folder(mods, i) != folder(mods, m.name):
                edges[folder(mods, m.name)].add(folder(mods, i))
    path = PACKAGE / "__init__.py"
    return {f: Module(f, path, 0, frozenset(e), ()) for f, e in edges.items()}


def folder_cycles(mods: dict[str, Module]) -> list[list[str]]:
    """The folder-level import cycles (a module cycle is one, but not only)."""
    return cycles(folder_graph(mods))


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


@dataclass(frozen=True)
class Sizes:
    """The size rule's findings, each a list of ``(module or module.Class, lines)``."""

    over_hard: list[tuple[str, int]]  # past the hard limit: an error, whatever the reason
    unexplained: list[tuple[str, int]]  # past the soft limit with no ``__long__``: a warning
    stale: list[tuple[str, int]]  # a ``__long__`` that is empty, or on one within the soft limit


def sizes(mods: dict[str, Module]) -> Sizes:
    found = Sizes([], [], [])
    for m in mods.values():
        reasons = dict(m.long_classes)
        scopes = [(m.name, m.lines, m.long, SOFT_MODULE_LINES, HARD_MODULE_LINES)] + [
            (f"{m.name}.{c}", n, reasons.get(c), SOFT_CLASS_LINES, HARD_CLASS_LINES)
            for c, n in m.classes
        ]
        for name, lines, reason, soft, hard in scopes:
            if lines > hard:
                found.over_hard.append((name, lines))
            elif lines > soft and reason is None:
                found.unexplained.append((name, lines))
            if reason is not None and (lines <= soft or not reason.strip()):
                found.stale.append((name, lines))
    return found


#: a measured timing: a number with a unit of time or throughput, or a speed ratio
TIMING = re.compile(
    r"""(?x)(?<![\w.])\d(?:[\d.,]*\d)?
    (?: \s?(?:ns|us|µs|ms|[KMG]B/s)(?![\w/]) | \s(?:s|seconds?|minutes?)\b
      | \s?x\s+(?:faster|slower|cheaper|dearer)\b | \s?%\s+(?:faster|slower)\b
      | \s?[-–]\s?\d(?:[\d.]*\d)?\s?x\b )
    | within\s\d+\s?%"""
)


def prose(path: Path) -> list[tuple[int, str]]:
    """A module's prose, as ``(first line, text)``: each run of comment lines (read with
    `tokenize`) and each string statement (docstrings, attribute docstrings). Strings that
    are values (text printed into generated code) are not prose."""
    source = path.read_text()
    found: list[tuple[int, str]] = []
    last = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string.lstrip("#:").strip()
        if tok.start[0] == last + 1 and found:
            found[-1] = (found[-1][0], f"{found[-1][1]} {text}")
        else:
            found.append((tok.start[0], text))
        last = tok.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                found.append((node.lineno, node.value.value))
    return found


def timings(package: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """``(module path, line, the timing)`` for each measured timing quoted in prose."""
    return [
        (str(path.relative_to(package.parent)), line + text.count("\n", 0, m.start()), m.group(0))
        for path in sorted(package.rglob("*.py"))
        for line, text in prose(path)
        for m in TIMING.finditer(text)
    ]


#: a pointer into the decisions: ``docs/decisions.md, "<the start of a decision's title>"``
#: (several titles may follow one ``docs/decisions.md:``)
POINTER = re.compile(r'docs/decisions\.md[,:]\s+((?:"[^"]+"(?:,\s+)?)+)')


def decision_pointers(package: Path = PACKAGE) -> list[tuple[str, str]]:
    """``(module path, title)`` for each decision that prose points to by its title."""
    return [
        (str(path.relative_to(package.parent)), " ".join(title.split()))
        for path in sorted(package.rglob("*.py"))
        for _, text in prose(path)
        for m in POINTER.finditer(text)
        for title in re.findall(r'"([^"]+)"', m.group(1))
    ]


def decision_titles(decisions: Path = PACKAGE.parent / "docs" / "decisions.md") -> list[str]:
    """The bold titles that open the decisions' entries, each on one line."""
    text = re.sub(r"\s+", " ", decisions.read_text())
    return re.findall(r"(?:^|\s)- \*\*(.+?)\*\*", text)


def subpackages(mods: dict[str, Module]) -> list[str]:
    return sorted(m.name for m in mods.values() if m.path.name == "__init__.py" and "." in m.name)


def calls(mod: Module) -> list[tuple[str, str]]:
    """(innermost enclosing function, name called) for each call of a name or attribute in
    ``mod``'s source; "" outside any function."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            where = node.name
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name:
                found.append((where, name))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(mod.path.read_text()), "")
    return found


def imported_names(mod: Module) -> set[str]:
    """The names ``mod`` imports from the package's modules (``from .x import name``)."""
    tree = ast.parse(mod.path.read_text())
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level or (node.module or "").startswith("sparsec"))
        for alias in node.names
    }


def keyword_only(mod: Module, function: str) -> tuple[str, ...]:
    """The keyword-only parameters of ``mod``'s top-level ``function``."""
    for node in ast.parse(mod.path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return tuple(a.arg for a in node.args.kwonlyargs)
    raise KeyError(function)


def int_constants(mod: Module) -> list[str]:
    """The UPPER_CASE names ``mod`` binds at its top level to an integer or a tuple of
    integers (written as literals): options a module fixes for itself."""

    def numeric(e: ast.expr) -> bool:
        if isinstance(e, ast.Tuple):
            return bool(e.elts) and all(numeric(x) for x in e.elts)
        if isinstance(e, ast.UnaryOp):
            return numeric(e.operand)
        if isinstance(e, ast.BinOp):
            return numeric(e.left) and numeric(e.right)
        return isinstance(e, ast.Constant) and type(e.value) is int

    found = []
    for node in ast.parse(mod.path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        for t in targets:
            if isinstance(t, ast.Name) and t.id.isupper() and value is not None and numeric(value):
                found.append(t.id)
    return found


def names_from(mod: Module, prefix: str) -> set[tuple[str, str]]:
    """(module, name) for each ``from <module> import name`` in ``mod`` whose module, made
    absolute, starts with ``prefix``."""
    package = mod.name if mod.path.name == "__init__.py" else mod.name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(mod.path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([base] if base else []))
        if base == prefix or base.startswith(prefix + "."):
            found |= {(base, alias.name) for alias in node.names}
    return found


@dataclass(frozen=True)
class Function:
    """One function of a module, by its qualified name (``Class.method``), as written."""

    name: str
    #: every parameter but ``*args``/``**kwargs`` (``self`` included), with its annotation
    params: tuple[tuple[str, str], ...]
    #: ``**kwargs``: its name and annotation, if it has one
    kwargs: tuple[str, str] | None


def functions(mod: Module) -> list[Function]:
    """Every function and method defined in ``mod``, nested ones included."""
    found: list[Function] = []

    def text(a: ast.arg) -> tuple[str, str]:
        return a.arg, ast.unparse(a.annotation) if a.annotation is not None else ""

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                a = child.args
                params = tuple(text(p) for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))
                kwargs = text(a.kwarg) if a.kwarg is not None else None
                found.append(Function(prefix + child.name, params, kwargs))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(mod.path.read_text()), "")
    return found


def annotations(mod: Module) -> list[str]:
    """Every annotation written in ``mod`` (of a parameter, a return, a variable or a
    field), as source text."""
    found: list[ast.expr] = []
    for node in ast.walk(ast.parse(mod.path.read_text())):
        if isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            found.append(node.returns)
    return [ast.unparse(a) for a in found]


def attributes(mod: Module, name: str) -> set[str]:
    """The attributes ``mod`` reaches on a variable called ``name`` (``name.attr``)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(mod.path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
    }


#: the targets' names (`sparsec.base.target.TARGETS`): only the API edge reads them
TARGET_NAMES = frozenset({"c", "cuda", "cuda-emulated"})
#: where the user's ``target=`` string becomes a `sparsec.base.target.Target`
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
                if m.name != "sparsec.base.target":  # where the names are defined
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
        f"folder cycles: {folder_cycles(mods)}",
        f"upward imports: {len(upward_imports(mods))} {upward_imports(mods)}",
        f"modules over {SOFT_MODULE_LINES} lines: "
        + ", ".join(f"{m.name} ({m.lines})" for m in mods.values() if m.lines > SOFT_MODULE_LINES),
        f"classes over {SOFT_CLASS_LINES} lines: "
        + ", ".join(
            f"{m.name}.{c} ({n})"
            for m in mods.values()
            for c, n in m.classes
            if n > SOFT_CLASS_LINES
        ),
        "long, with a reason: "
        + ", ".join(
            [f"{m.name}: {m.long}" for m in mods.values() if m.long]
            + [f"{m.name}.{c}: {r}" for m in mods.values() for c, r in m.long_classes]
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
