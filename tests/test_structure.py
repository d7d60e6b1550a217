"""The package's shape (issue: one stage per folder): imports flow one way down the stages,
there is no import cycle (TYPE_CHECKING and function-local imports count), and no module or
class grows past the size a reader can hold. Measured by `structure` from the source."""

from __future__ import annotations

import structure

#: the limits LAYOUT.md asks for: modules of a few hundred lines, no god class
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 400


def test_no_import_cycles() -> None:
    assert structure.cycles(structure.modules()) == []


def test_imports_flow_down_the_stages() -> None:
    mods = structure.modules()
    assert all(structure.stage(name) >= 0 for name in mods), [
        name for name in mods if structure.stage(name) < 0
    ]
    assert structure.upward_imports(mods) == []


#: code generation, of which the runtime knows only `Generated` (and `sparsec.abi`): what a
#: call needs of the statement, the lowering or the printers travels in it as data
COMPILER = (
    "sparsec.pipeline",
    "sparsec.passes",
    "sparsec.lower",
    "sparsec.backends",
    "sparsec.middle.bound",
    "sparsec.middle.staging",
    "sparsec.frontend.concrete",
)
GENERATED = ("sparsec.backends", "sparsec.backends.generated")


def test_the_runtime_sits_above_the_compiler() -> None:
    """No runtime module imports the compiler's code, only `Generated` and the ABI (issue
    37: the runtime read the slack and chunk table from the lowering, the stage hints from
    the passes, the launcher's printing from the printer, the statement's entry bound and
    staging from the middle end, and a dtype check from the pipeline)."""
    mods = structure.modules()

    def compiler(name: str) -> bool:
        inside = any(name == p or name.startswith(p + ".") for p in COMPILER)
        return inside and name not in GENERATED

    runtime = (m for m in mods.values() if m.name.startswith("sparsec.runtime"))
    assert sorted((m.name, i) for m in runtime for i in m.imports if compiler(i)) == []


def test_no_module_or_class_over_the_limits() -> None:
    mods = structure.modules().values()
    assert [(m.name, m.lines) for m in mods if m.lines > MAX_MODULE_LINES] == []
    assert [(m.name, c, n) for m in mods for c, n in m.classes if n > MAX_CLASS_LINES] == []


def test_the_measure_sees_what_it_claims() -> None:
    """The graph is read from the source: a known edge and a known stage order are found."""
    mods = structure.modules()
    assert "sparsec.ir.nodes" in mods["sparsec.abi"].imports
    assert structure.stage("sparsec.api.kernel") < structure.stage("sparsec.lower.lowerer")
    assert structure.stage("sparsec.errors") == len(structure.STAGES) - 1
    toy = {
        "a": structure.Module("a", mods["sparsec.abi"].path, 1, frozenset({"b"}), ()),
        "b": structure.Module("b", mods["sparsec.abi"].path, 1, frozenset({"a"}), ()),
    }
    assert structure.cycles(toy) == [["a", "b"]]
