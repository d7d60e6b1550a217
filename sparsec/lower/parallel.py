"""How a loop runs: serially, on CPU threads or vector lanes, or mapped to the GPU.

`loop_setup` takes the loop's `parallelize` (the user's, or the default policy's: see
`policy.schedules.cpu_default`), runs the race analysis (can two iterations write one
output element?) and carries out the race strategy: atomic updates, a private
accumulator per thread (OpenMP's reduction), a private copy of the output per thread
(`Temporary`), or on the GPU (`gpu`) per-thread partial sums and warp shuffles. The
loop's body is then lowered with the strategy's `Flags` in force (`inside`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..base.errors import ScheduleError
from ..ir import nodes as ir
from ..middle.commands import Races, Unit
from ..middle.plan import Parallelize
from ..tensors.formats import Dense, LevelNames
from .ctx import AccSink, DenseWsSink, OutputSink, WorkspaceSink
from .env import LowerEnv
from .gpu_loops import gpu_setup
from .output import output_size
from .races import Loop, LoopSetup, race, race_strategies, why_not

#: the most output elements `Temporary` copies in all (threads x output size)
MAX_COPY_ELEMENTS = 1 << 26


def inside(env: LowerEnv, setup: LoopSetup, build: Callable[[], ir.Block]) -> ir.Block:
    """Lower a loop body with the setup's flags in force."""
    with env.scope(**setup.flags):
        return ir.block(*setup.body_pre, build())


def loop_setup(env: LowerEnv, asked: Loop) -> LoopSetup:
    """How the loop ``asked`` runs: its `parallelize` (race analysis and strategy), the
    user's or the default policy's (`Parallelize.default`), and `unroll`."""
    loop, kind, outermost = asked.var, asked.kind, asked.outermost
    setup = LoopSetup()
    plan = env.decided.plan
    if plan is not None and loop in plan.unroll:
        if kind != "for":
            raise ScheduleError(
                f"unroll({loop},{plan.unroll[loop]}): the loop over {loop} is a while "
                f"loop ({kind}); unroll applies to for loops"
            )
        setup.unroll = plan.unroll[loop]
    req = plan.parallel.get(loop) if plan is not None else None
    if req is not None and setup.unroll:
        raise ScheduleError(
            f"unroll({loop},{setup.unroll}): the loop over {loop} is also parallelized "
            f"({req.origin}); unroll a loop inside it"
        )
    if req is None or not env.inputs.threads_ok:
        return setup
    if req.default and not outermost:
        # the default's loop ran inside a precompute's workspace: it stays serial
        return setup
    if env.inputs.gpu:
        return gpu_setup(env, asked, req, setup)
    return _cpu_setup(env, asked, req, setup)


def _cpu_setup(env: LowerEnv, asked: Loop, req: Parallelize, setup: LoopSetup) -> LoopSetup:
    """A loop that a `parallelize` runs on CPU threads or vector lanes."""
    loop, distinct, sink, kind, trip = asked.var, asked.distinct, asked.sink, asked.kind, asked.trip
    outermost = asked.outermost
    cmd = req.origin
    flags = env.flags
    if req.unit.gpu:
        raise ScheduleError(
            f"{cmd}: {req.unit} is a CUDA unit; the C target runs CPUThread and CPUVector loops"
        )
    if kind != "for":
        raise ScheduleError(
            f"{cmd}: the loop over {loop} is a while loop ({kind}); its iterations depend "
            "on each other. Parallelize an enclosing loop, or iterate one operand's "
            f"positions with pos({loop},...)"
        )
    if flags.in_vector or (flags.in_threads and req.unit == Unit.CPUThread):
        raise ScheduleError(
            f"{cmd}: it is nested inside another parallel loop; only one CPUThread loop, "
            "with CPUVector loops inside it, is supported"
        )
    if flags.in_where or isinstance(sink, (WorkspaceSink, DenseWsSink)):
        raise ScheduleError(
            f"{cmd}: the loop runs inside a workspace (precompute) that all its iterations "
            "share; parallelize a loop outside the workspace"
        )
    out = env.inputs.lhs.name
    lhs = set(env.inputs.lhs.indices)
    asm = env.decided.assembler
    if asm is not None and not isinstance(sink, AccSink):
        if not (req.unit == Unit.CPUThread and asm.mode.rowwise and outermost and loop in lhs):
            raise ScheduleError(
                f"{cmd}: the sparse output {out} ({env.inputs.spec.output.format}) is appended "
                "in one sequence; only its outermost row loop can run on CPU threads, and "
                "only when a dense level holds the rows (e.g. csr)"
            )
        decl, par = _parallel_for(env, loop, trip)
        setup.pre.append(decl)
        setup.parallel = par
        setup.flags["in_threads"] = True
        if not req.default:
            env.found.notes.append(f"{loop}: CPUThread, rows of {out} assembled independently")
        return setup
    target_acc = isinstance(sink, AccSink)
    why = race(env, loop, distinct, sink)
    setup.flags["in_threads" if req.unit == Unit.CPUThread else "in_vector"] = True
    if why is None:
        if req.unit == Unit.CPUThread:
            decl, par = _parallel_for(env, loop, trip)
            setup.pre.append(decl)
            setup.parallel = par
        else:
            setup.parallel = ir.Parallel(Unit.CPUVector)
        if not req.default:
            env.found.notes.append(
                f"{loop}: {req.unit}, race-free (each iteration writes its own {out} elements)"
            )
        return setup
    usable = race_strategies(env, req.unit, target_acc)
    advice = (
        f"Use {' or '.join(usable)}"
        if usable
        else f"Parallelize a loop whose iterations write distinct elements of {out}"
    )
    match req.races:
        case Races.NoRaces | Races.IgnoreRaces:
            raise ScheduleError(
                f"{cmd}: iterations of {loop} write the same element of {out} ({why}); "
                f"with {req.races} that would give a wrong sum. {advice}"
            )
        case Races.Atomics if req.unit == Unit.CPUThread and asm is None:
            assert isinstance(sink, (AccSink, OutputSink))
            setup.flags["atomic_writes"] = True
            decl, par = _parallel_for(env, loop, trip)
            setup.pre.append(decl)
            setup.parallel = par
            target = sink.name if isinstance(sink, AccSink) else f"{out}"
            env.found.notes.append(f"{loop}: CPUThread, atomic updates of {target}")
        case Races.Temporary | Races.ParallelReduction if target_acc:
            assert isinstance(sink, AccSink)
            sums = (sink.name,) if sink.name else ()
            marks = (sink.flag,) if sink.flag else ()
            if req.unit == Unit.CPUThread:
                decl, par = _parallel_for(env, loop, trip)
                setup.pre.append(decl)
                setup.parallel = replace(par, reduction=sums, flags=marks)
            else:
                setup.parallel = ir.Parallel(Unit.CPUVector, reduction=sums, flags=marks)
            into = out if req.default else "a private accumulator"
            env.found.notes.append(f"{loop}: {req.unit}, reduction(+) into {into}")
        case Races.Temporary if req.unit == Unit.CPUThread:
            _private_copies(env, loop, trip, setup)
            env.found.notes.append(
                f"{loop}: CPUThread, each thread adds into its own copy of {out}, summed after"
            )
        case _:
            raise ScheduleError(
                f"{cmd}: {req.races} does not apply here: {why_not(env, req.races, req.unit)}"
                f"; the iterations of {loop} race ({why}). {advice}"
            )
    return setup


def _parallel_for(env: LowerEnv, var: str, trip: ir.Expr) -> tuple[ir.Stmt, ir.Parallel]:
    """A dynamic schedule with about `Inputs.chunks_per_thread` chunks per thread
    (skewed rows balance)."""
    env.found.parallel_loops.append(var)
    chunk = env.inputs.namer.fresh("chunk")
    threads = ir.Var(env.inputs.sig.threads)
    per = ir.Bin("*", ir.IntLit(env.inputs.chunks_per_thread), threads)
    size = ir.Bin("/", ir.Bin("+", trip, ir.Bin("-", per, ir.IntLit(1))), per)
    decl = ir.Decl(ir.I64, chunk, ir.Call("max", (ir.IntLit(1), size)))
    return decl, ir.Parallel(Unit.CPUThread, "dynamic", chunk)


def _private_copies(env: LowerEnv, loop: str, trip: ir.Expr, setup: LoopSetup) -> None:
    """`Temporary`: each thread adds into a zeroed copy of the output, summed after.

    The copies exist only with several threads and at most `MAX_COPY_ELEMENTS` in all;
    otherwise (or when calloc fails) the loop runs on one thread into the output.
    """
    out = env.inputs.spec.output
    copy = LevelNames(output_size(env))
    size = copy.dim
    threads = ir.Var(env.inputs.sig.threads)
    base = env.inputs.namer.fresh(f"{out.name}_copies")
    mine = env.inputs.namer.fresh(f"{out.name}_mine")
    vals = env.inputs.sig.array(out.name, "vals")
    total = ir.mul(threads, size)
    worth = ir.conj(
        ir.Bin(">", threads, ir.IntLit(1)),
        ir.Bin("<=", total, ir.IntLit(MAX_COPY_ELEMENTS)),
    )
    decl, par = _parallel_for(env, loop, trip)
    setup.pre += [ir.Alloc(ir.VAL, base, total, worth), decl]
    setup.parallel = replace(par, only_if=base)
    setup.body_pre.append(
        ir.Pointer(ir.VAL, mine, base, ir.mul(ir.Call("thread_id", ()), size), vals)
    )
    setup.flags["out_redirect"] = mine
    q, t = env.inputs.namer.fresh("q"), env.inputs.namer.fresh("t")
    # thread t's copy is one more dense level above the output: element q of copy t
    element = Dense().locate_position(ir.Var(t), ir.Var(q), copy)
    add = ir.Assign(ir.Load(vals, ir.Var(q)), ir.Load(base, element), "+=")
    combine = ir.For(
        q,
        ir.IntLit(0),
        size,
        ir.block(ir.For(t, ir.IntLit(0), threads, ir.block(add))),
        ir.Parallel(Unit.CPUThread, "static"),
    )
    setup.post += [
        ir.Comment(f"sum the threads' copies of {out.name}"),
        ir.If(((ir.Var(base), ir.block(combine, ir.Free(base))),)),
    ]
