"""The package's shape (issue: one stage per folder): imports flow one way down the stages,
there is no import cycle (TYPE_CHECKING and function-local imports count), and no module or
class grows past the size a reader can hold. Measured by `structure` from the source."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import structure
from structure import Module


def test_no_import_cycles() -> None:
    assert structure.cycles(structure.modules()) == []


def test_no_folder_import_cycle() -> None:
    """No import cycle between folders either (issue 37 item 6): the root package imported
    `api/` while nine folders imported root modules (`errors`, `abi`, `resources`), so the
    root and those nine sat in one cycle; the leaves are folders of their own now (`base/`,
    `abi/`). A module's folder is its package; the root's modules are folder ``sparsec``."""
    assert structure.folder_cycles(structure.modules()) == []
    mods = structure.modules()
    toy = {
        "sparsec": structure.Module(
            "sparsec", mods["sparsec"].path, 1, frozenset({"sparsec.api.x"}), ()
        ),
        "sparsec.api.x": structure.Module(
            "sparsec.api.x", mods["sparsec.ir.nodes"].path, 1, frozenset({"sparsec.e"}), ()
        ),
        "sparsec.e": structure.Module(
            "sparsec.e", mods["sparsec.ir.nodes"].path, 1, frozenset(), ()
        ),
    }
    assert structure.cycles(toy) == []
    assert structure.folder_cycles(toy) == [["sparsec", "sparsec.api"]]


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
    "sparsec.middle.capacity",
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
    """A module is as long as its one idea needs (issue 37 item 7), so the size limits are
    soft, with a hard ceiling: a module over 450 lines (a class over 400) says why in a
    string assigned to ``__long__`` in its body, and the test warns, naming it, where none
    is given; nothing may pass 800 lines (a class 600), whatever its reason; a ``__long__``
    that is empty or stands on a module or class within the soft limit fails, so a reason
    never outlives its length. Split where the idea splits, not to meet a number."""
    found = structure.sizes(structure.modules())
    assert found.over_hard == []
    assert found.stale == []
    for name, lines in found.unexplained:
        warnings.warn(
            f"{name} has {lines} lines, past the soft limit, and gives no `__long__` reason",
            stacklevel=1,
        )


def test_the_measure_sees_what_it_claims() -> None:
    """The graph is read from the source: a known edge and a known stage order are found."""
    mods = structure.modules()
    assert "sparsec.ir.nodes" in mods["sparsec.abi"].imports
    assert structure.stage("sparsec.api.kernel") < structure.stage("sparsec.lower.lowerer")
    assert structure.stage("sparsec.base.errors") == len(structure.STAGES) - 1
    toy = {
        "a": structure.Module("a", mods["sparsec.abi"].path, 1, frozenset({"b"}), ()),
        "b": structure.Module("b", mods["sparsec.abi"].path, 1, frozenset({"a"}), ()),
    }
    assert structure.cycles(toy) == [["a", "b"]]


def test_the_size_rule_sees_reasons() -> None:
    """The size rule on toy modules: the soft limit warns unless a reason is given, the hard
    limit fails whatever the reason, and a reason on a short module or class is stale."""
    path = structure.modules()["sparsec.abi"].path

    def mod(lines: int, long: str | None, classes: tuple[tuple[str, int], ...] = ()) -> Module:
        return structure.Module("m", path, lines, frozenset(), classes, long)

    soft, hard = structure.SOFT_MODULE_LINES, structure.HARD_MODULE_LINES
    assert structure.sizes({"m": mod(soft + 1, None)}).unexplained == [("m", soft + 1)]
    assert structure.sizes({"m": mod(soft + 1, "one table")}) == structure.Sizes([], [], [])
    assert structure.sizes({"m": mod(hard + 1, "one table")}).over_hard == [("m", hard + 1)]
    assert structure.sizes({"m": mod(soft, "one table")}).stale == [("m", soft)]
    assert structure.sizes({"m": mod(soft + 1, " ")}).stale == [("m", soft + 1)]
    klass = mod(10, None, (("C", structure.SOFT_CLASS_LINES + 1),))
    assert structure.sizes({"m": klass}).unexplained == [("m.C", structure.SOFT_CLASS_LINES + 1)]
    tree = ast.parse("__long__ = 'why'\nclass C:\n    __long__ = 'because'\n    x = 1\n")
    assert structure._long(tree.body) == "why"
    assert [structure._long(c.body) for c in tree.body if isinstance(c, ast.ClassDef)] == [
        "because"
    ]


def test_no_comment_quotes_a_timing(tmp_path: Path) -> None:
    """Measurements live in docs/decisions.md, under the decision they support, with the
    machine they were taken on (issue 37 item 6): a comment or docstring in sparsec/ gives
    the reason and points there, and quotes no timing (a number of ns, us, ms, s or GB/s,
    or a speed ratio such as ``1.2-1.4x`` or ``4x faster``). Strings that are values, text
    printed into generated code among them, are not prose and are not read."""
    assert structure.timings() == []
    toy = tmp_path / "toy.py"
    toy.write_text("x = '9 ms'  # 3 ms\n# 1.2-1.4x on one\n# thread\ndef f():\n    '4x faster'\n")
    found = [m.group(0) for _, t in structure.prose(toy) for m in structure.TIMING.finditer(t)]
    assert found == ["3 ms", "1.2-1.4x", "4x faster"]


def test_decision_pointers_name_a_decision() -> None:
    """Prose that points to ``docs/decisions.md, "<title>"`` names the start of a decision's
    bold title there, so a pointer outlives no decision it points to."""
    titles = structure.decision_titles()
    pointers = structure.decision_pointers()
    assert len(pointers) > 20
    assert [p for p in pointers if not any(t.startswith(p[1]) for t in titles)] == []


def test_every_module_is_in_the_architecture() -> None:
    """docs/architecture.md's "Every module" names each module of sparsec/ by its path under
    the package (`api/kernel.py`), and names no module that is gone (issue 37 item 6)."""
    mods = structure.modules().values()
    paths = {str(m.path.relative_to(structure.PACKAGE)) for m in mods}
    doc = (structure.PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert "\n## Every module\n" in doc
    section = doc.split("\n## Every module\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w/]+\.py)`", section))
    assert sorted(paths - named) == []
    assert sorted(named - paths) == []


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
    assert "schedule" in structure.keyword_only(mods["sparsec.lower.entry"], "lower")


#: the integers a pass module may fix for itself: a stage's bit in the template's mask is
#: the ABI between the pass and its template, not a tuned option
PASS_CONSTANTS = frozenset({("sparsec.passes.stages", "REMAINDER")})


def test_the_passes_take_their_options_from_the_decision() -> None:
    """Policy is one typed value per kernel (issue 37 item 3, `sparsec.policy.decision`):
    no pass module fixes a tuned option of its own (tile widths, jam ways, coarsening
    factors and block, dot blocks, prefetch distances were module constants); the pipeline
    takes none from a pass (it imported the tile's vectors and the coarsened block), nor
    does a printer (the C one read the narrowest tile), and the pipeline applies a decision
    (`generate` and `generate_cuda` take one); the lowering takes the chunks per thread
    (fixed at 8 in lower/parallel.py); and `Kernel.__init__` asks policy for the inputs'
    preparation instead of deciding re-layouts, regrouping and copies."""
    mods = structure.modules()
    passes = [m for name, m in mods.items() if name.startswith("sparsec.passes")]
    fixed = {(m.name, c) for m in passes for c in structure.int_constants(m)}
    assert sorted(fixed - PASS_CONSTANTS) == []
    pipeline = [m for name, m in mods.items() if name.startswith("sparsec.pipeline")]
    taken = {t for m in pipeline for t in structure.names_from(m, "sparsec.passes")}
    assert sorted((m, n) for m, n in taken if n.isupper() and n not in ("BAND", "DEPTH")) == []
    # a printer reads the tiles' stages (the template's guards), never a pass's options
    backends = (m for name, m in mods.items() if name.startswith("sparsec.backends"))
    read = {(m.name, i) for m in backends for i in m.imports if i.startswith("sparsec.passes")}
    assert read == {("sparsec.backends.c", "sparsec.passes.stages")}
    for module, function in (("c", "generate"), ("cuda", "generate_cuda")):
        assert "decision" in structure.keyword_only(mods[f"sparsec.pipeline.{module}"], function)
    assert "chunks_per_thread" in structure.keyword_only(mods["sparsec.lower.entry"], "lower")
    assert ("__init__", "prepare") in structure.calls(mods["sparsec.api.kernel"])
    # the measure finds a constant where one is
    assert structure.int_constants(mods["sparsec.passes.stages"]) == ["REMAINDER"]


#: the old mode switches of a sparse output's assembly (issue 37 item 5)
MODE_SWITCHES = frozenset({"counting", "append", "chunked"})


def test_an_assembly_has_one_mode() -> None:
    """A sparse output's kernel is assembled in one `AssemblyMode` (`AssemblyMode.of`
    decides rows and chunks from the layout, once): the Assembler, the environment and
    `lower` take a ``mode``, no boolean switches that two paths could read apart."""
    mods = structure.modules()
    takers = {
        ("sparsec.lower.assemble", "Assembler.__init__"),
        ("sparsec.lower.env", "LowerEnv.__init__"),
        ("sparsec.lower.entry", "lower"),
    }
    seen = {
        (m, f.name): {name for name, _ in f.params}
        for m in {m for m, _ in takers}
        for f in structure.functions(mods[m])
        if (m, f.name) in takers
    }
    assert seen.keys() == takers
    assert {k: p & MODE_SWITCHES for k, p in seen.items() if p & MODE_SWITCHES} == {}
    assert all("mode" in p for p in seen.values())


def test_lowering_flags_are_typed() -> None:
    """The flags a loop body is lowered under change by name and type that mypy checks
    (`FlagChanges`): no function of `sparsec.lower` takes ``**kwargs: Any``, and nothing
    there is annotated ``dict[str, Any]`` (a setup's flags were one)."""
    mods = structure.modules()
    lower = [m for name, m in mods.items() if name.startswith("sparsec.lower")]
    loose = [
        (m.name, f.name)
        for m in lower
        for f in structure.functions(m)
        if f.kwargs is not None and f.kwargs[1] in ("", "Any")
    ]
    assert loose == []
    stringly = [(m.name, a) for m in lower for a in structure.annotations(m) if "Any]" in a]
    assert stringly == []


def test_the_lowering_environment_is_split() -> None:
    """A lowering's state is in three parts, each attribute reached through its own:
    what it is given (`Inputs`, frozen), what is decided before the nest (`Decided`: the
    schedule and what follows from it) and what the nest finds (`Found`); the environment
    itself holds those and the scoped flags."""
    mods = structure.modules()
    lower = [m for name, m in mods.items() if name.startswith("sparsec.lower")]
    reached = {a for m in lower for a in structure.attributes(m, "env")}
    assert reached == {"inputs", "decided", "found", "flags", "scope"}
    source = mods["sparsec.lower.env"].path.read_text()
    assert '__slots__ = ("inputs", "decided", "found", "flags")' in source
    assert "@dataclass(frozen=True, slots=True)\nclass Inputs:" in source


#: the most parameters a function of `sparsec.lower` takes (``self`` not counted): the
#: point being lowered travels as one value (`ctx.NestPoint`, `coiterate.Walk`,
#: `races.Loop`), not as a list of its parts
MOST_PARAMETERS = 6
#: the functions allowed more, each with its reason
MANY_PARAMETERS = {
    # the inputs of one lowering, by keyword, from which `env.Inputs` is built
    ("sparsec.lower.env", "LowerEnv.__init__"),
}


def test_lowering_state_travels_as_values() -> None:
    """No function of `sparsec.lower` takes more than `MOST_PARAMETERS` parameters but
    those allowed above: the loop or point being lowered is one frozen value."""
    mods = structure.modules()
    lower = [m for name, m in mods.items() if name.startswith("sparsec.lower")]
    long = {
        (m.name, f.name): len([p for p, _ in f.params if p != "self"])
        for m in lower
        for f in structure.functions(m)
    }
    over = {k for k, n in long.items() if n > MOST_PARAMETERS}
    assert sorted(over - MANY_PARAMETERS) == []
    assert sorted(MANY_PARAMETERS - over) == []  # an allowance no longer needed goes


def test_only_the_api_edge_decides_by_a_target_s_name() -> None:
    """A target is a `sparsec.base.target.Target`, made once from the user's string at the API
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


def test_a_lowered_kernel_s_gpu_launch_is_one_optional_field() -> None:
    """What only a GPU kernel has (its grid, block, zeroing, warp helpers and workspace)
    is one optional `GpuLaunch` of `LoweredKernel`, so a CPU kernel carries none of it."""
    path = structure.modules()["sparsec.lower.entry"].path
    classes = {c.name: c for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef)}
    fields = {
        f.target.id: ast.unparse(f.annotation)
        for f in classes["LoweredKernel"].body
        if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
    }
    launch = {"grid", "block", "zero_before", "shuffles", "groups", "segments", "scratch"}
    assert sorted(launch & set(fields)) == []
    assert fields["gpu"] == "GpuLaunch | None"
