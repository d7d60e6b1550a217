"""The package's shape (issue: one stage per folder): imports flow one way down the stages,
there is no import cycle (TYPE_CHECKING and function-local imports count), and no module or
class grows past the size a reader can hold. Measured by `structure` from the source."""

from __future__ import annotations

from pathlib import Path

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


def test_only_the_api_edge_decides_by_a_target_s_name() -> None:
    """A target is a `sparsec.target.Target`, made once from the user's string at the API
    edge: everywhere else code asks its capabilities (``gpu``, ``openmp``, ``lanes``,
    ``emulated``), never compares its name, so a new target is a new row."""
    assert structure.target_decisions(structure.modules()) == []


def test_the_frontend_spells_no_function_for_a_target() -> None:
    """A function of the language means one thing (`frontend.functions`); each dialect of
    the printer spells every one the lowerer emits as a call, and only there."""
    from sparsec.frontend import functions

    text = Path(functions.__file__).read_text()
    assert "__builtin_" not in text and "cuda" not in text.lower()
    from sparsec.backends.targets import DIALECTS

    built = {"relu", "sign", "sigmoid"}  # expressions of others (`lower.lowerer._function`)
    calls = {f"fn_{name}" for name in functions.FUNCTIONS} - {f"fn_{name}" for name in built}
    for dialect in DIALECTS.values():
        assert calls <= set(dialect.calls), dialect.name
