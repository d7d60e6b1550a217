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


#: what decides a kernel's schedule (`sparsec.middle.schedule`): the makers of the plan and
#: of the schedule, the loop orders found from it, and the loop order search itself
MAKERS = frozenset({"make_plan", "make_schedule", "loop_nest", "natural_loops", "every_loop"})
SCHEDULING = MAKERS | {"loop_order", "step_order"}
#: the calls lower/ keeps, by (module, function, name): each nested sum's loops and each
#: step of a sequence are ordered inside the loops bound where the nest reaches them, which
#: only the nest being built knows (a precompute or a sequence moves them), so they are
#: part of building it, not of the kernel's schedule
NEST_ORDERS = frozenset(
    {("sparsec.lower.lowerer", "_nested_sum", "loop_order")}
    | {("sparsec.lower.sequence", "emit_sequence", "step_order")}
)


def test_the_schedule_is_decided_outside_lower() -> None:
    """The schedule is decided once, by the middle end: no module of `sparsec.lower`
    imports the plan's or the schedule's maker, none calls the loop order search but the
    nest's own calls above, and `lower` takes the schedule as an input."""
    mods = structure.modules()
    lower = [m for name, m in mods.items() if name.startswith("sparsec.lower")]
    made = sorted((m.name, n) for m in lower for n in structure.imported_names(m) & MAKERS)
    assert made == []
    called = {(m.name, fn, n) for m in lower for fn, n in structure.calls(m) if n in SCHEDULING}
    assert called == NEST_ORDERS
    assert "schedule" in structure.keyword_only(mods["sparsec.lower.kernel"], "lower")
