"""sparsec.graph against python-graphblas's LAGraph-style algorithms (bench/graph_baselines.py)
and scipy.sparse.csgraph, in the same process (issue 40).

    python -m bench graphs [--quick] [--threads 1,2] [--scale 18]

On an undirected R-MAT graph (Graph500's parameters, edge factor 16, seed 0; `--scale`
sets its size, 2^18 vertices by default): BFS levels from a vertex, BFS parents, SSSP on
integer weights 1..255, PageRank (LAGraph's, tolerance 1e-4), triangle count, connected
components, and betweenness from a batch of 4 sources; and sparsec's BFS in bool against
the same BFS in float64 (the bytes a type moves). Each contender gets its preferred
input, prepared outside the timing: a `sparsec.graph.Graph`, a GraphBLAS matrix (with
its out-degrees, and ``A`` as its own transpose: the graph is symmetric; for triangles the
lower triangle relabelled by degree, as sparsec's `Graph` keeps its own), a scipy CSR
matrix. Every result is compared before timing: levels, distances, counts and labels
exactly; parents by validity (a parent is a neighbour one level up: the algorithms pick
different ones); PageRank and betweenness to 1e-9.

Timing: per case and thread count the contenders run in `measure_rounds` (interleaved
rounds, pooled medians); a ratio is the baseline's ms / sparsec's ms (> 1: sparsec
faster); csgraph runs on one thread. The load average before and after each case is
recorded. Without python-graphblas it says so and times nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from sparsec.graph import (
    Graph,
    betweenness,
    bfs,
    connected_components,
    pagerank,
    rmat,
    sssp,
    triangles,
)

from .common import (
    Table,
    environment,
    graphblas,
    measure_rounds,
    progress,
    settle,
    write_results,
)


@dataclass
class Case:
    name: str
    #: threads -> contender -> call
    calls: Callable[[int], dict[str, Callable[[], Any]]]
    #: contender's result -> None, or raise (compared before timing)
    check: Callable[[str, Any], None]
    medians: dict[int, dict[str, float]] = field(default_factory=dict)
    load: dict[int, tuple[float, float]] = field(default_factory=dict)


def _equal(want: Any) -> Callable[[str, Any], None]:
    def check(who: str, got: Any) -> None:
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            raise SystemExit(f"{who} differs from the reference")

    return check


def _close(want: np.ndarray) -> Callable[[str, Any], None]:
    def check(who: str, got: Any) -> None:
        if not np.allclose(np.asarray(got), want, rtol=1e-9, atol=1e-12):
            raise SystemExit(f"{who} differs from the reference by {np.abs(got - want).max()}")

    return check


def _parents_valid(a: sp.csr_array, levels: np.ndarray, source: int) -> Callable[[str, Any], None]:
    def check(who: str, got: Any) -> None:
        parents = np.asarray(got)
        reached = np.flatnonzero(levels > 0)
        p = parents[reached]
        ok = (parents[source] == source) and (parents[levels < 0] == -1).all()
        ok = ok and (levels[p] == levels[reached] - 1).all()
        ok = ok and bool(np.all(a[p, reached] != 0))
        if not ok:
            raise SystemExit(f"{who}: a parent is no neighbour one level up")

    return check


def _cases(gb: Any, base: Any, scale: int) -> list[Case]:
    a = rmat(scale, 16, seed=0)
    n = a.shape[0]
    g = Graph(a)
    G = base.to_graphblas(a, bool)
    deg = base.degrees(G)
    GI = base.to_graphblas(a, np.int64)
    source = int(np.argmax(np.diff(a.indptr)))  # in the big component
    levels = bfs(g, source)
    hops = csgraph.shortest_path(a, unweighted=True, indices=source)
    if not np.array_equal(np.where(np.isinf(hops), -1, hops).astype(np.int64), levels):
        raise SystemExit("sparsec's BFS differs from csgraph")
    weights = rmat(scale, 16, seed=0, weights=(1, 255))
    gw, GW = Graph(weights), base.to_graphblas(weights, np.int64)
    far = csgraph.dijkstra(weights, indices=source)
    distances = np.where(np.isinf(far), np.iinfo(np.int64).max, 0)
    distances[np.isfinite(far)] = far[np.isfinite(far)].astype(np.int64)
    _, label = csgraph.connected_components(a, directed=False)
    least = np.full(label.max() + 1, n)
    np.minimum.at(least, label, np.arange(n))
    sources = np.flatnonzero(np.diff(a.indptr))[:: max(1, n // 5)][:4]
    lower = base.presorted_lower(a)  # both sides' triangle counts read a prepared L
    ranks = base.pagerank(GI, transpose=GI, degree=base.degrees(GI))
    central = base.betweenness(GI, sources, transpose=GI)

    def on(t: int, calls: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
        gb.ss.config["nthreads"] = t
        return calls

    return [
        Case(
            "bfs levels",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: bfs(g, source, threads=t),
                    "graphblas": lambda: base.bfs_levels(G, source, transpose=G, degree=deg),
                    "csgraph": lambda: csgraph.shortest_path(a, unweighted=True, indices=source),
                },
            ),
            lambda who, got: None if who == "csgraph" else _equal(levels)(who, got),
        ),
        Case(
            "bfs parents",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: bfs(g, source, parents=True, threads=t)[1],
                    "graphblas": lambda: base.bfs_parents(G, source, transpose=G, degree=deg),
                },
            ),
            _parents_valid(a, levels, source),
        ),
        Case(
            "sssp (int64)",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: sssp(gw, source, threads=t),
                    "graphblas": lambda: base.sssp(GW, source),
                    "csgraph": lambda: csgraph.dijkstra(weights, indices=source),
                },
            ),
            lambda who, got: None if who == "csgraph" else _equal(distances)(who, got),
        ),
        Case(
            "pagerank",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: pagerank(g, threads=t),
                    "graphblas": lambda: base.pagerank(GI, transpose=GI, degree=base.degrees(GI)),
                },
            ),
            _close(ranks),
        ),
        Case(
            "triangles",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: triangles(g, threads=t),
                    "graphblas": lambda: base.triangles(G, lower=lower),
                },
            ),
            _equal(base.triangles(G)),
        ),
        Case(
            "components",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: connected_components(g, threads=t),
                    "graphblas": lambda: base.connected_components(GI),
                    "csgraph": lambda: csgraph.connected_components(a, directed=False),
                },
            ),
            lambda who, got: None if who == "csgraph" else _equal(least[label])(who, got),
        ),
        Case(
            f"betweenness ({len(sources)})",
            lambda t: on(
                t,
                {
                    "sparsec": lambda: betweenness(g, sources, threads=t),
                    "graphblas": lambda: base.betweenness(GI, sources, transpose=GI),
                },
            ),
            _close(central),
        ),
        Case(
            "bfs bool vs float64",
            lambda t: {
                "sparsec": lambda: bfs(g, source, threads=t),
                "float64": lambda: bfs(g, source, dtype="float64", threads=t),
            },
            _equal(levels),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench graphs", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="scale 10, one short round")
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    ap.add_argument("--scale", type=int, default=18, help="R-MAT scale (2^scale vertices)")
    args = ap.parse_args(argv)
    gb = graphblas()
    if gb is None:
        return 0
    from . import graph_baselines as base

    settle(not args.quick)
    scale = 10 if args.quick else args.scale
    threads = [int(t) for t in str(args.threads).split(",")]
    progress(f"graphs: R-MAT scale {scale}")
    cases = _cases(gb, base, scale)
    for case in cases:
        for t in threads:
            calls = case.calls(t)
            for who, call in calls.items():
                try:
                    case.check(who, call())
                except SystemExit as err:
                    raise SystemExit(f"{case.name}, {t} thread(s): {err}") from None
            progress(f"graphs: {case.name} at {t} thread(s)")
            before = os.getloadavg()[0]
            timings = measure_rounds(calls, repeats=3)
            case.load[t] = (before, os.getloadavg()[0])
            case.medians[t] = {who: timing.median_ms for who, timing in timings.items()}
    table = Table(["case", "threads", "sparsec ms", "baseline", "baseline ms", "ratio", "load"])
    for case in cases:
        for t in threads:
            mine = case.medians[t]["sparsec"]
            lo, hi = case.load[t]
            for who, theirs in case.medians[t].items():
                if who != "sparsec":
                    ratio = f"{theirs / mine:.2f}x"
                    table.add(
                        case.name,
                        t,
                        f"{mine:.4g}",
                        who,
                        f"{theirs:.4g}",
                        ratio,
                        f"{lo:.1f}-{hi:.1f}",
                    )
    print(
        f"[bench] sparsec.graph on R-MAT scale {scale} (ratio = baseline ms / sparsec ms; "
        "> 1: sparsec faster; csgraph runs on one thread)"
    )
    print(table.render())
    payload = {
        "environment": environment(),
        "scale": scale,
        "cases": {
            c.name: {str(t): {"medians_ms": c.medians[t], "load": c.load[t]} for t in threads}
            for c in cases
        },
    }
    write_results("graphs", payload)
    return 0
