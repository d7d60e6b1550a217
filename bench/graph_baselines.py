"""Graph algorithms in GraphBLAS (python-graphblas), the baselines sparsec's are timed against.

Each is written after the LAGraph algorithm it names (Davis et al., "LAGraph: linear algebra,
network analysis libraries, and the study of graph algorithms", IPDPSW 2021), in python-
graphblas over SuiteSparse:GraphBLAS. They take a `graphblas.Matrix`, made once from a
`scipy.sparse.csr_array` adjacency matrix by `to_graphblas`, so a timing of the algorithm
excludes the conversion, and return numpy arrays (a count for `triangles`).

The graph is undirected unless said: ``G`` is symmetric, and serves as its own transpose.
`bfs_levels`, `bfs_parents`, `pagerank` and `betweenness` also take a directed ``G`` with its
transpose ``transpose=G.T.new()`` (LAGraph's ``G->AT``); `sssp` follows ``G``'s direction;
`triangles` and `connected_components` need a symmetric ``G``. Values are ignored except by
`sssp` (weights), which is why the conversion takes the dtype: ``bool`` for the pattern
algorithms, int64 or float64 for `sssp`.

Importing this module needs python-graphblas (``pip install python-graphblas``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import graphblas as gb
import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from graphblas import agg, binary, monoid, select, semiring, unary

__all__ = [
    "betweenness",
    "bfs_levels",
    "bfs_parents",
    "connected_components",
    "degrees",
    "pagerank",
    "sssp",
    "to_graphblas",
    "triangles",
]

#: LAGraph's direction-optimizing constants (Beamer, Asanović and Patterson, SC 2012):
#: push -> pull when the frontier's edges exceed the unexplored edges / ALPHA (or, after a
#: first pull, when the frontier exceeds n / BETA1); pull -> push when the frontier shrinks
#: to at most n / BETA2 vertices
ALPHA, BETA1, BETA2 = 8.0, 8.0, 512.0


def to_graphblas(A: Any, dtype: npt.DTypeLike | None = None) -> gb.Matrix:
    """``A`` (any scipy sparse matrix, converted to CSR with duplicates summed) as a
    row-major `graphblas.Matrix` of ``dtype`` (``A``'s own when None). Not timed."""
    csr = sp.csr_array(A, copy=True)
    csr.sum_duplicates()
    values = csr.data if dtype is None else csr.data.astype(dtype)
    nrows, ncols = csr.shape
    return gb.Matrix.from_csr(csr.indptr, csr.indices, values, nrows=nrows, ncols=ncols)


def degrees(G: gb.Matrix) -> gb.Vector:
    """Each row's entry count (LAGraph's cached ``G->out_degree``); absent where zero."""
    return G.reduce_rowwise(agg.count).new(dtype="INT64")


def bfs_levels(
    G: gb.Matrix,
    source: int,
    *,
    transpose: gb.Matrix | None = None,
    degree: gb.Vector | None = None,
) -> np.ndarray:
    """The BFS level of every vertex from ``source`` (0), -1 where unreachable.

    LAGraph's ``LAGr_BreadthFirstSearch`` (``LG_BreadthFirstSearch_SSGrB``) computing levels
    only: the frontier ``q`` is a bool vector, advanced under the ``any_pair`` semiring with
    the visited set's complemented structural mask, ``q<!v.S, replace> = q any.pair G``
    (push, ``vxm``) or ``q<!v.S, replace> = G' any.pair q`` (pull, ``mxv`` on the
    transpose, dot products), switching direction by `_Direction`'s rule.
    ``degree`` (`degrees`) may be computed beforehand, as LAGraph caches it.
    """
    level = _bfs(G, source, transpose, degree, parents=False)
    return level.to_dense(fill_value=-1, dtype=np.int64)


def bfs_parents(
    G: gb.Matrix,
    source: int,
    *,
    transpose: gb.Matrix | None = None,
    degree: gb.Vector | None = None,
) -> np.ndarray:
    """A BFS parent of every reached vertex (``source`` its own parent), -1 elsewhere.

    LAGraph's ``LAGr_BreadthFirstSearch`` with the parent vector: as `bfs_levels`, but the
    frontier is int64 and the semiring is ``any_secondi`` (SuiteSparse's ``GxB_ANY_SECONDI``:
    the product of ``q(k)`` and ``G(k, j)`` is ``k``), so a newly reached vertex gets *any*
    frontier neighbour as its parent; the parents, not the levels, are the visited mask.
    Which parent is found may vary between runs and thread counts; every one is valid.
    """
    parent = _bfs(G, source, transpose, degree, parents=True)
    return parent.to_dense(fill_value=-1, dtype=np.int64)


class _Direction:
    """LAGraph's push/pull rule (``LG_BreadthFirstSearch_SSGrB``), before each step.

    Pushing, with a frontier of ``nq`` vertices (``last`` the step before), the edges
    unexplored start at ``nvals`` and lose the frontier's degree sum each step; the search
    switches to pull when the frontier is growing and its edges exceed the unexplored ones
    over ``ALPHA``. Once a pull has been done the degrees are no longer summed: a push
    switches back to pull when the frontier grows past ``n / BETA1``. Pulling, it switches
    to push when the frontier shrinks to ``n / BETA2`` vertices or fewer. When fewer than
    ``n`` edges are left unexplored, it stays in push to the end.
    """

    def __init__(self, n: int, nvals: int, degree: gb.Vector) -> None:
        self.n, self.unexplored, self.degree = n, nvals, degree
        self.push, self.switching, self.any_pull = True, True, False
        self.w = gb.Vector("INT64", n)

    def choose(self, q: gb.Vector, nq: int, last: int) -> bool:
        """True to push the next step from frontier ``q``."""
        if not self.switching:
            return True
        if self.push:
            growing = nq > last
            if self.unexplored < self.n:
                self.switching = False
                return True
            if self.any_pull:
                self.push = not (growing and nq > self.n / BETA1)
            else:
                self.w(q.S, replace=True) << self.degree
                frontier_edges = int(self.w.reduce(monoid.plus).new().value or 0)
                self.unexplored -= frontier_edges
                self.push = not (growing and frontier_edges > self.unexplored / ALPHA)
        elif nq < last and nq <= self.n / BETA2:
            self.push = True
        self.any_pull = self.any_pull or not self.push
        return self.push


def _bfs(
    G: gb.Matrix,
    source: int,
    transpose: gb.Matrix | None,
    degree: gb.Vector | None,
    *,
    parents: bool,
) -> gb.Vector:
    """The BFS of `bfs_levels` and `bfs_parents`: the levels or the parents."""
    n = _square(G)
    _vertex(source, n, "source")
    AT = G if transpose is None else transpose
    if parents:
        sr = semiring.ss.any_secondi["INT64"]
        q = gb.Vector.from_coo([source], [source], dtype="INT64", size=n)
    else:
        sr = semiring.any_pair["BOOL"]
        q = gb.Vector.from_coo([source], [True], dtype="BOOL", size=n)
    seen = q.dup(dtype="INT64")
    if not parents:
        seen[source] = 0
    rule = _Direction(n, G.nvals, degrees(G) if degree is None else degree)
    nq, last = 1, 0
    depth, visited = 1, 1
    while visited < n:
        if rule.choose(q, nq, last):
            q(~seen.S, replace=True) << q.vxm(G, sr)
        else:
            q(~seen.S, replace=True) << AT.mxv(q, sr)
        last, nq = nq, q.nvals
        if nq == 0:
            break
        if parents:
            seen(q.S) << q
        else:
            seen(q.S) << depth
        depth, visited = depth + 1, visited + nq
    return seen


def sssp(G: gb.Matrix, source: int) -> np.ndarray:
    """Shortest path distances from ``source`` along ``G``'s weighted edges (row -> column).

    Bellman-Ford in GraphBLAS (LAGraph's ``LAGraph_BF_basic``, ``d = d min.+ A`` until no
    distance changes), relaxing each round only from the vertices whose distance dropped in
    the last one: ``t = frontier min.plus G``, the new frontier is ``t``'s entries below
    ``d`` (or new), merged into ``d``. Exact for int weights. Unreachable: ``+inf`` for a
    float ``G``, the dtype's maximum for an int ``G``. A negative cycle reachable from
    ``source`` (in an undirected graph, any negative edge) raises ValueError.
    """
    n = _square(G)
    _vertex(source, n, "source")
    dtype = G.dtype.np_type
    if np.issubdtype(dtype, np.integer):
        unreachable: Any = np.iinfo(dtype).max
    elif np.issubdtype(dtype, np.floating):
        unreachable = np.inf
    else:
        raise TypeError(
            f"sssp needs int or float weights, not {G.dtype}; use to_graphblas(A, dtype)"
        )
    sr = semiring.min_plus[G.dtype]
    d = gb.Vector.from_coo([source], [0], dtype=G.dtype, size=n)
    frontier = d.dup()
    for _ in range(n):
        t = frontier.vxm(G, sr).new()
        better = t.ewise_union(d, binary.lt, unreachable, unreachable).new()
        frontier = gb.Vector(G.dtype, n)
        frontier(better.V) << t
        if frontier.nvals == 0:
            return d.to_dense(fill_value=unreachable, dtype=dtype)
        d(frontier.S) << frontier
    raise ValueError(f"sssp: a negative cycle is reachable from vertex {source}")


def pagerank(
    G: gb.Matrix,
    damping: float = 0.85,
    iterations: int = 100,
    *,
    tol: float = 1e-4,
    transpose: gb.Matrix | None = None,
    degree: gb.Vector | None = None,
) -> np.ndarray:
    """PageRank of every vertex, float64, summing to 1.

    LAGraph's ``LAGr_PageRank`` (the GAP benchmark's formulation, ``LAGr_PageRankGAP``, plus
    its handling of dangling vertices): ``r = 1/n``; each step ``w = r ./ (out_degree /
    damping)``, then ``r' = (1 - damping)/n + damping * sum(r(sinks))/n``, and ``r' += G'
    plus.second w`` (``mxv`` on the transpose). A sink (no out-edge) spreads its rank over
    every vertex, as networkx does (``LAGr_PageRankGAP`` lets it leak instead: the two
    agree on graphs without sinks). A self loop is an out-edge. Stops after ``iterations``
    steps, or once ``sum |r' - r| <= tol`` (LAGraph's defaults: 100 and 1e-4; ``tol=0``
    runs all the steps). LAGraph computes in float32; this in float64.
    """
    n = _square(G)
    if n == 0:
        return np.zeros(0)
    AT = G if transpose is None else transpose
    scaled = (degrees(G) if degree is None else degree).apply(binary.truediv, right=damping)
    d = scaled.new(dtype="FP64")
    teleport = (1 - damping) / n
    r = gb.Vector.from_scalar(1.0 / n, n, dtype="FP64")
    t = gb.Vector("FP64", n)
    w = gb.Vector("FP64", n)
    at_sinks = gb.Vector("FP64", n)
    sr = semiring.plus_second["FP64"]
    for _ in range(iterations):
        t, r = r, t  # t: the last step's ranks
        w << t.ewise_mult(d, binary.truediv)
        at_sinks(~d.S, replace=True) << t
        sinks = float(at_sinks.reduce(monoid.plus).new().value or 0.0)
        r[:] << teleport + damping * sinks / n
        r(binary.plus) << AT.mxv(w, sr)
        t(binary.minus) << r
        t << t.apply(unary.abs)
        if float(t.reduce(monoid.plus).new().value) <= tol:
            break
    return r.to_dense(dtype=np.float64)


def triangles(G: gb.Matrix, *, lower: gb.Matrix | None = None) -> int:
    """The number of triangles of the undirected graph ``G`` (self loops ignored).

    A masked SpGEMM on the lower triangle, as LAGraph's ``LAGr_TriangleCount`` does: ``L``
    is ``G``'s strictly lower triangle, ``C<L.S> = L plus.pair L``, and the count is the sum
    of ``C``: ``C(i, j)`` (``j < i``) counts the ``k`` with ``j < k < i`` adjacent to both
    (LAGraph's ``Sandia_LL``), each triangle once. ``lower``: ``L`` prepared beforehand,
    as `presorted_lower` makes it (the degree presort LAGraph's auto-sort applies to a
    power-law graph); else ``G``'s own, extracted inside the call.
    """
    n = _square(G)
    L = G.select(select.tril, -1).new() if lower is None else lower
    C = gb.Matrix("INT64", n, n)
    C(L.S) << L.mxm(L, semiring.plus_pair["INT64"])
    return int(C.reduce_scalar(monoid.plus).new().value or 0)


def presorted_lower(A: Any) -> gb.Matrix:
    """The strictly lower triangle of ``A`` relabelled by degree, highest first: the
    variant fastest on R-MAT at scale 18 among {no sort, ascending, descending} x {``L
    L``, ``L L'``, ``U U'``} (Zen 5, 2 threads: 0.92 s against 1.1 to 4.4 s for the
    others; bench/graphs.py's baseline)."""
    csr = sp.csr_array(A)
    degree = np.diff(csr.indptr)
    order = np.argsort(-degree, kind="stable")
    relabelled = csr[order][:, order]
    return to_graphblas(sp.tril(relabelled, -1, format="csr"), bool)


def connected_components(G: gb.Matrix) -> np.ndarray:
    """The component of each vertex, named by its smallest vertex id (int64).

    FastSV (Zhang, Azad and Buluç, "FastSV: a distributed-memory connected component
    algorithm with fast convergence", SIAM PP 2020; LAGraph's ``LG_CC_FastSV5``), over the
    parent vector ``f`` (initially ``f(i) = i``) and the grandparents ``gf = f[f]``:
    stochastic hooking ``mngf = min(mngf, G min.second gf)`` then ``f[f(i)] = min(f[f(i)],
    mngf(i))``, aggressive hooking ``f = min(f, mngf)``, shortcutting ``f = min(f, gf)``,
    ``gf = f[f]``, until ``gf`` stops changing. The scatter with duplicates, which LAGraph
    writes by hand (``Reduce_assign``), is a vector build with ``dup_op=min``. A parent only
    decreases and never leaves its component, so each component's smallest vertex is its
    root: the result needs no renaming.
    """
    n = _square(G)
    ids = np.arange(n, dtype=np.int64)
    f = gb.Vector.from_coo(ids, ids, dtype="INT64", size=n)
    gf = f.dup()
    mngf = f.dup()
    sr = semiring.min_second["INT64"]
    while True:
        mngf(binary.min) << G.mxv(gf, sr)
        parents = f.to_dense(dtype=np.int64)
        hooks = gb.Vector.from_coo(
            parents, mngf.to_dense(dtype=np.int64), size=n, dup_op=binary.min
        )
        f(binary.min) << hooks
        f(binary.min) << mngf
        f(binary.min) << gf
        parents = f.to_dense(dtype=np.int64)
        grand = f[parents].new()
        if grand.isequal(gf):
            return parents
        gf = grand


def betweenness(
    G: gb.Matrix, sources: Sequence[int] | np.ndarray, *, transpose: gb.Matrix | None = None
) -> np.ndarray:
    """Brandes' betweenness centrality from a batch of ``sources`` (float64, unnormalised).

    LAGraph's ``LAGr_Betweenness`` (Brandes' algorithm in batches, after Buluç and Gilbert's
    Combinatorial BLAS): the ``ns`` searches run together as the rows of ``ns x n``
    matrices. Forward: ``paths`` (shortest path counts) starts at 1 on each row's source;
    ``frontier<!paths.S, replace> = frontier plus.first G`` (the first frontier from
    ``paths``), its pattern kept per depth as ``S[d]`` and added into ``paths``, until it
    is empty. Backward, from ``bcu = 1`` everywhere: for each depth ``d`` from the deepest
    down to 1, ``W<S[d], replace> = bcu ./ paths``, ``W<S[d-1], replace> = W plus.first
    G'``, ``bcu += W .* paths``. The result is ``sum(bcu, rows) - ns``: the sum over the
    sources of each vertex's dependency. Over every source of an undirected graph this is
    twice networkx's unnormalised ``betweenness_centrality`` (which halves for undirected
    graphs). A repeated source is counted each time.
    """
    n = _square(G)
    src = np.asarray(sources, dtype=np.int64).reshape(-1)
    for s in src:
        _vertex(int(s), n, "source")
    ns = len(src)
    if ns == 0 or n == 0:
        return np.zeros(n)
    AT = G if transpose is None else transpose
    sr = semiring.plus_first["FP64"]
    paths = gb.Matrix.from_coo(np.arange(ns), src, 1.0, dtype="FP64", nrows=ns, ncols=n)
    frontier = gb.Matrix("FP64", ns, n)
    frontier(~paths.S, replace=True) << paths.mxm(G, sr)
    levels: list[gb.Matrix] = []
    while frontier.nvals:
        levels.append(frontier.apply(unary.one["BOOL"]).new())
        paths(binary.plus) << frontier
        frontier(~paths.S, replace=True) << frontier.mxm(G, sr)
    bcu = gb.Matrix.from_scalar(1.0, ns, n, dtype="FP64")
    W = gb.Matrix("FP64", ns, n)
    for d in range(len(levels) - 1, 0, -1):
        W(levels[d].S, replace=True) << bcu.ewise_mult(paths, binary.truediv)
        W(levels[d - 1].S, replace=True) << W.mxm(AT, sr)
        bcu(binary.plus) << W.ewise_mult(paths, binary.times)
    total = bcu.reduce_columnwise(monoid.plus).new()
    return total.to_dense(dtype=np.float64) - ns


def _square(G: gb.Matrix) -> int:
    if G.nrows != G.ncols:
        raise ValueError(f"an adjacency matrix is square, not {G.nrows} x {G.ncols}")
    return int(G.nrows)


def _vertex(v: int, n: int, name: str) -> None:
    if not 0 <= v < n:
        raise ValueError(f"{name} {v} is not a vertex of a graph of {n} vertices (0..{n - 1})")
