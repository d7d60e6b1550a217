"""LAGraph's basic algorithms, each a short loop over index-notation kernels with masks and
semirings (docs/semantics.md: Semirings, Masks, Value types). A graph is its adjacency
matrix: ``A(i,j)`` stored is an edge from ``i`` to ``j`` (`Graph`).

* `bfs`: levels (and parents) from a source, push or pull per level by the frontier's
  edges against the unvisited vertices' (Beamer's direction-optimising rule): push is
  ``y(j) = A(i,j) * q(i)`` over the frontier's rows under ``any_pair``, pull is
  ``y(j) = R(j,i) * q(i)`` over the unvisited rows (mask ``U``) of the reverse graph
  ``R`` (A itself where A is symmetric) under ``or_second``, each row's scan stopping at its
  first frontier neighbour; parents take a frontier neighbour (``any_second`` on vertex
  ids: a pulled row's scan stops at its first), in int32 where the ids fit. A byte per
  vertex marks the visited ones, and a push runs on one thread where the frontier has
  fewer edges than the graph has vertices (`_threads_for`).
* `sssp`: Bellman-Ford under ``min_plus``, relaxing only from the vertices whose distance
  changed (``t(j) = A(i,j) * d(i)`` over a sparse frontier).
* `pagerank`: LAGraph's PageRank (``r(j) = R(j,i) * w(i)`` over the reverse graph ``R``,
  with ``w = r / deg``, sinks spread over every vertex).
* `triangles`: ``t = L(i,j) * L(i,k) * L(j,k)`` on the strictly lower triangle ``L`` of
  ones (the masked ``L .* (L @ L.T)`` summed in one kernel: row ``i`` of ``L`` in a dense
  workspace, each row ``j`` it holds scanned against it), exact in int64; or LAGraph's
  Sandia_LUT, ``C(i,j) = L(i,k) * L(j,k)`` under ``plus_pair`` masked by ``L``, summed.
* `connected_components`: FastSV's hooking (``g(i) = A(i,j) * f(j)`` under ``min_second``)
  with shortcutting, until the labels settle; each component is labelled by its least
  vertex.
* `betweenness`: Brandes' algorithm for a batch of sources at once: path counts pushed
  forward over the frontier's rows, dependencies pushed back level by level.

Every kernel is compiled once per process (`sparsec.kernel` keeps them) and runs on
``threads`` threads (None: the default).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..api.kernel import Kernel, kernel
from ..base.errors import InputError
from ..runtime.binding import resolve_threads
from ..tensors.formats import parse_format
from ..tensors.storage import LevelStorage, choose_index_dtype
from ..tensors.tensor import Tensor, as_tensor

#: the kernels, by name: (statement, formats, semiring, mask, dtype)
KERNELS: dict[str, tuple[str, dict[str, str], str, str, str | None]] = {
    "push": ("y(j) = A(i,j) * q(i)", {"A": "csr", "q": "s", "y": "dense"}, "any_pair", "", "bool"),
    "pull": (
        "y(j) = A(j,i) * q(i)",
        {"A": "csr", "q": "dense", "y": "dense", "U": "s"},
        "or_second",  # q's truth; A's values (all 1) never read
        "U",
        "bool",
    ),
    "push_parent": (
        "p(j) = A(i,j) * q(i)",
        {"A": "csr", "q": "s", "p": "dense"},
        "any_second",
        "",
        "int64",
    ),
    "pull_parent": (
        "p(j) = A(j,i) * q(i)",
        {"A": "csr", "q": "dense", "p": "dense", "U": "s"},
        "any_second",  # a row's scan stops at its first frontier neighbour
        "U",
        "int64",
    ),
    "relax": ("t(j) = A(i,j) * d(i)", {"A": "csr", "d": "s", "t": "dense"}, "min_plus", "", None),
    # pulled: each r(j) sums its in-neighbours' w over the reverse graph's row j, so the
    # threads write apart (a push would add into private copies of r); plus_second: R's
    # values (all 1) are never read
    "rank": (
        "r(j) = R(j,i) * w(i)",
        {"R": "csr", "w": "dense", "r": "dense"},
        "plus_second",
        "",
        "float64",
    ),
    # L holds ones: plus_times distributes, so the three-way product is summed whole (under
    # plus_pair the sum over i would close inside L(i,j) * L(i,k) first, docs/semantics.md)
    "triangles": (
        "t = L(i,j) * L(i,k) * L(j,k)",
        {"L": "csr"},
        "plus_times",
        "",
        "int64",
    ),
    # LAGraph's Sandia_LUT: C<L> = L * L', counted by plus_pair (values unread)
    "sandia": (
        "C(i,j) = L(i,k) * L(j,k)",
        {"L": "csr", "C": "csr", "M": "csr"},
        "plus_pair",
        "M",
        "int64",
    ),
    "hook": (
        "g(i) = A(i,j) * f(j)",
        {"A": "csr", "f": "dense", "g": "dense"},
        "min_second",
        "",
        "int64",
    ),
    "spread": (
        "T(j,s) = A(i,j) * F(i,s)",
        {"A": "csr", "F": "sd", "T": "dense"},
        "plus_second",  # A's values (all 1) never read
        "",
        "float64",
    ),
    # each vertex's dependencies summed over the sources (numpy's sum along a short last
    # axis is several times slower, and a BLAS product by ones leaves OpenBLAS's threads
    # spinning for a while after it, taking the cores from the kernels that follow)
    "total": ("c(i) = D(i,s)", {"D": "dd", "c": "dense"}, "plus_times", "", "float64"),
}


#: the kernels with a schedule of their own (else the default's)
SCHEDULES = {
    # row i of L scattered into a dense workspace once, then each row j it holds is
    # scanned against it (LAGraph's masked saxpy with a dense workspace; the workspace is
    # hoisted out of the loop over j, and cleared by revisiting row i: `placement`)
    "triangles": "precompute(L(i,k), k, kw)",
}


def graph_kernel(name: str, dtype: str | None = None) -> Kernel:
    """The kernel called ``name`` in `KERNELS` (compiled once per process), in its type or
    ``dtype``; kept here too, so that a level of a loop finds its kernel by one lookup."""
    found = _built.get((name, dtype))
    if found is None:
        statement, formats, ring, mask, own = KERNELS[name]
        options: dict[str, Any] = {"semiring": ring, "dtype": dtype or own}
        if mask:
            options["mask"] = mask
        if name in SCHEDULES:
            options["schedule"] = SCHEDULES[name]
        found = _built[(name, dtype)] = kernel(statement, formats, **options)
    return found


_built: dict[tuple[str, str | None], Kernel] = {}


@dataclass
class Graph:
    """A graph's adjacency matrix ``A`` (``A(i,j)`` stored: an edge ``i -> j``; its values
    are the weights `sssp` reads), with the copies algorithms read kept: its pattern as
    bool and int64 CSR, its out-degrees, its strictly lower triangle. Build one and pass
    it to several algorithms; any matrix scipy, torch or `sparsec.Tensor` holds is
    accepted where a `Graph` is (and made into one)."""

    matrix: Tensor
    _copies: dict[str, Tensor] = field(default_factory=dict, repr=False)

    def __init__(self, adjacency: Any) -> None:
        matrix = adjacency.matrix if isinstance(adjacency, Graph) else as_tensor(adjacency, "csr")
        if matrix.order != 2 or matrix.shape[0] != matrix.shape[1]:
            raise InputError(
                f"a graph's adjacency matrix is square; this one has shape {matrix.shape}"
            )
        self.matrix = matrix.to_format("csr")
        self._copies = {}
        self._symmetric: bool | None = None
        self._degrees: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def degrees(self) -> np.ndarray:
        """Each vertex's out-degree (stored entries of its row), int64 (kept, read-only)."""
        found = self._degrees
        if found is None:
            pos = self.matrix.levels[1].pos
            assert pos is not None
            found = self._degrees = np.diff(pos).astype(np.int64)
            found.flags.writeable = False
        return found

    def pattern(self, dtype: str = "bool") -> Tensor:
        """The adjacency pattern, every stored entry 1, in ``dtype`` (kept)."""
        found = self._copies.get(dtype)
        if found is None:
            m = self.matrix
            found = Tensor(m.shape, m.format, m.levels, np.ones(m.nnz, dtype=dtype), m.index_dtype)
            self._copies[dtype] = found
        return found

    @property
    def symmetric(self) -> bool:
        """Whether every edge's reverse is an edge too (decided once)."""
        if self._symmetric is None:
            coords, _ = self.matrix.coords()
            n = self.n
            keys = coords[0].astype(np.int64) * n + coords[1]
            reverse = np.sort(coords[1].astype(np.int64) * n + coords[0])
            self._symmetric = bool(np.array_equal(keys, reverse))
        return self._symmetric

    def reverse(self, dtype: str = "bool") -> Tensor:
        """The transpose's pattern (edges followed backwards) in ``dtype``: the pattern
        itself for a symmetric graph (kept)."""
        if self.symmetric:
            return self.pattern(dtype)
        key = f"reverse-{dtype}"
        found = self._copies.get(key)
        if found is None:
            coords, _ = self.matrix.coords()
            ones = np.ones(self.matrix.nnz, dtype=dtype)
            found = Tensor.from_coo(coords[::-1], ones, self.matrix.shape, "csr")
            self._copies[key] = found
        return found

    def lower(self) -> Tensor:
        """The strictly lower triangle's pattern (``i > j``), int64 ones in CSR (kept), of
        the graph relabelled by degree, highest first: a row then holds only neighbours of
        a higher degree, so none is long (at most ``sqrt(2m)`` entries) and merging two
        rows costs little, as LAGraph's degree presort does for power-law graphs."""
        found = self._copies.get("lower")
        if found is None:
            coords, _ = self.matrix.coords()
            label = np.empty(self.n, dtype=np.int64)
            label[np.argsort(-self.degrees, kind="stable")] = np.arange(self.n)
            coords = label[coords]
            below = coords[0] > coords[1]
            found = Tensor.from_coo(
                coords[:, below],
                np.ones(int(below.sum()), dtype=np.int64),
                self.matrix.shape,
                "csr",
            )
            self._copies["lower"] = found
        return found


def as_graph(adjacency: Any) -> Graph:
    return adjacency if isinstance(adjacency, Graph) else Graph(adjacency)


def _vertex(g: Graph, source: Any) -> int:
    if isinstance(source, bool) or not isinstance(source, (int, np.integer)):
        raise InputError(f"source must be a vertex number, not {source!r}")
    if not 0 <= int(source) < g.n:
        raise InputError(f"source {source} is not a vertex of a graph of {g.n} vertices")
    return int(source)


def _sparse_vector(n: int, where: np.ndarray, values: np.ndarray) -> Tensor:
    """A sparse vector of ``values`` at ``where``, which the caller guarantees sorted,
    distinct and in ``[0, n)`` (as `np.flatnonzero` gives them): built by the trusted
    constructor, without `Tensor.from_arrays`' copies and O(n) checks, and without
    freezing the caller's arrays (the tensor holds views of them, which the caller
    leaves unchanged while it uses the tensor)."""
    idt = choose_index_dtype(None, (n,), ())
    index = where.astype(idt, copy=False).view()
    pos = np.array([0, index.size], dtype=idt)
    return Tensor((n,), _VECTOR, (LevelStorage(pos, index),), values.view(), idt)


_VECTOR, _ROWS = parse_format("s", 1), parse_format("sd", 2)


#: Beamer's direction switch: pull while the frontier's edges exceed the unvisited
#: vertices' edges / ALPHA, push again once the frontier has fewer than n / BETA vertices
ALPHA, BETA = 14, 24


def bfs(
    graph: Any,
    source: int,
    *,
    parents: bool = False,
    dtype: str = "bool",
    threads: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Breadth-first search from ``source``: each vertex's level (the source's 0, -1 where
    unreachable), and with ``parents`` also a parent of each reached vertex (its least
    neighbour one level up; the source is its own, -1 where unreachable), both int64.
    Edges are followed from ``i`` to ``j`` where ``A(i,j)`` is stored. ``dtype``: the
    type the levels' frontier kernels compute in (bool, the fewest bytes; any other value
    type gives the same levels); parents compute on vertex ids in int32 (int64 past 2^31
    vertices)."""
    g = as_graph(graph)
    n, src = g.n, _vertex(g, source)
    degrees = g.degrees
    levels = np.full(n, -1, dtype=np.int64)
    levels[src] = 0
    visited = np.zeros(n, dtype=bool)
    visited[src] = True
    parent = np.full(n, -1, dtype=np.int64) if parents else None
    if parent is not None:
        parent[src] = src
    frontier = np.array([src], dtype=np.int64)
    unvisited_edges = int(degrees.sum()) - int(degrees[src])
    pulling, depth = False, 0
    # parents compute on vertex ids, in int32 where they fit (half the bytes of int64)
    ids = choose_index_dtype(None, (n,), ())
    none = int(np.iinfo(ids.name).max)  # the add's identity: no frontier neighbour
    dtype = ids.name if parents else dtype
    ones = np.ones(n, dtype=dtype)  # sliced: the values of masks and frontiers
    # push reads the frontier's rows of A; pull the unvisited rows of A's transpose
    a, reverse = g.pattern(dtype), g.reverse(dtype)
    while frontier.size:
        depth += 1
        edges = None if pulling else int(degrees[frontier].sum())
        if edges is None:
            pulling = frontier.size * BETA >= n
        else:
            pulling = edges * ALPHA > unvisited_edges
        if pulling:
            # the unvisited vertices: the mask of the rows pulled (a row's scan stops at
            # its first frontier neighbour: or's and any's terminal value)
            unseen = np.flatnonzero(~visited)
            unvisited = _sparse_vector(n, unseen, ones[: unseen.size])
            if parent is None:
                q = np.zeros(n, dtype=dtype)
                q[frontier] = 1
                y = graph_kernel("pull", dtype)(A=reverse, q=q, U=unvisited, threads=threads)
            else:
                q = np.full(n, none, dtype=ids)
                q[frontier] = frontier
                p = graph_kernel("pull_parent", dtype)(A=reverse, q=q, U=unvisited, threads=threads)
        else:
            # a push on several threads ors into a private copy of y per thread: only
            # where the frontier's edges repay it
            edges = int(degrees[frontier].sum()) if edges is None else edges
            on = _threads_for(edges, n, threads)
            if parent is None:
                q_sparse = _sparse_vector(n, frontier, ones[: frontier.size])
                y = graph_kernel("push", dtype)(A=a, q=q_sparse, threads=on)
            else:
                q_sparse = _sparse_vector(n, frontier, frontier.astype(ids))
                p = graph_kernel("push_parent", dtype)(A=a, q=q_sparse, threads=on)
        if parent is None:
            reached = y if y.dtype == np.bool_ else y != 0
        else:
            reached = p < none
        # reached and not visited (a pull reaches only unvisited rows; a push any)
        found = np.flatnonzero(reached if pulling else reached > visited)
        if parent is not None:
            parent[found] = p[found]
        visited[found] = True
        levels[found] = depth
        unvisited_edges -= int(degrees[found].sum())
        frontier = found
    return (levels, parent) if parent is not None else levels


def sssp(graph: Any, source: int, *, threads: int | None = None) -> np.ndarray:
    """Single-source shortest path lengths from ``source`` over the weights ``A(i,j)``
    (Bellman-Ford under ``min_plus``, relaxing from the vertices whose distance changed):
    in the weights' type, exact for integers; unreachable vertices hold ``+inf`` (an
    integer type's largest value). A negative cycle reachable from the source is an
    `InputError`."""
    g = as_graph(graph)
    n, src = g.n, _vertex(g, source)
    weights = g.matrix
    dtype = weights.vals.dtype
    far = np.iinfo(dtype).max if dtype.kind in "iu" else np.inf
    if dtype.kind == "b":
        raise InputError("sssp reads edge weights: pass integer or floating values, not bool")
    distance = np.full(n, far, dtype=dtype)
    distance[src] = 0
    degrees = g.degrees
    changed = np.array([src], dtype=np.int64)
    for _ in range(n):
        if not changed.size:
            return distance
        d = _sparse_vector(n, changed, distance[changed])
        on = _threads_for(int(degrees[changed].sum()), n, threads)
        t = graph_kernel("relax")(A=weights, d=d, threads=on)
        better = np.flatnonzero(t < distance)
        distance[better] = t[better]
        changed = better
    if changed.size:
        raise InputError("the graph has a negative cycle reachable from the source")
    return distance


def pagerank(
    graph: Any,
    damping: float = 0.85,
    *,
    tolerance: float = 1e-4,
    iterations: int = 100,
    threads: int | None = None,
) -> np.ndarray:
    """PageRank as LAGraph's ``LAGr_PageRank`` (the GAP benchmark's formulation with its
    sinks handled): ``r = (1 - d) / n + d * (A^T (r / outdeg) + sinks / n)`` from ``1 /
    n``, where ``sinks`` is the rank of the vertices without out-edges, spread over every
    vertex (as networkx does; GAP lets it leak), until the L1 change is at most
    ``tolerance`` or after ``iterations``. float64, summing to 1."""
    g = as_graph(graph)
    n = g.n
    if not 0 <= damping <= 1:
        raise InputError(f"damping must be in [0, 1], not {damping}")
    degrees = g.degrees.astype(np.float64)
    inverse = np.divide(1.0, degrees, out=np.zeros(n), where=degrees > 0)
    rank = np.full(n, 1.0 / max(n, 1))
    teleport = (1.0 - damping) / max(n, 1)
    reverse = g.reverse("float64")
    sink = degrees == 0
    for _ in range(iterations):
        spread = graph_kernel("rank")(R=reverse, w=rank * inverse, threads=threads)
        new = teleport + damping * (spread + rank[sink].sum() / n)
        change = float(np.abs(new - rank).sum())
        rank = new
        if change <= tolerance:
            break
    return rank


def triangles(graph: Any, *, method: str = "fused", threads: int | None = None) -> int:
    """The number of triangles of an undirected graph (a symmetric ``A``; self-loops and
    the values ignored), each ``k < j < i`` once, in int64: ``method="fused"`` sums
    ``L(i,j) * L(i,k) * L(j,k)`` over the strictly lower triangle ``L`` of ones in one
    kernel; ``"sandia"`` is LAGraph's Sandia_LUT, the masked ``plus_pair`` product
    ``C<L> = L * L'`` (a sparse output with L's pattern), then its values summed."""
    g = as_graph(graph)
    lower = g.lower()
    if method == "fused":
        return int(graph_kernel("triangles")(L=lower, threads=threads))
    if method == "sandia":
        counts = graph_kernel("sandia")(L=lower, M=lower, threads=threads)
        return int(counts.vals.sum())
    raise InputError(f"method must be 'fused' or 'sandia', not {method!r}")


def connected_components(graph: Any, *, threads: int | None = None) -> np.ndarray:
    """The connected components of an undirected graph (a symmetric ``A``): each vertex's
    label is the least vertex of its component (int64). FastSV's loop: every vertex hooks
    to its neighbours' least label (``min_second``), then labels jump to their labels'
    labels (shortcutting) until none changes."""
    g = as_graph(graph)
    a = g.pattern("int64")
    label = np.arange(g.n, dtype=np.int64)
    while True:
        least = graph_kernel("hook")(A=a, f=label, threads=threads)
        new = np.minimum(label, least)
        # hook each label's root to the least label a member of its tree saw
        np.minimum.at(new, label, new)
        while True:  # shortcut: every label points at its root
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            return label
        label = new


def betweenness(graph: Any, sources: Any, *, threads: int | None = None) -> np.ndarray:
    """Brandes' betweenness centrality from a batch of ``sources`` (LAGraph's
    ``LAGr_Betweenness``): for each vertex, the sum over the sources ``s`` and targets
    ``t`` of the share of shortest ``s``-``t`` paths through it (the sources' own
    dependencies excluded; unnormalised, each ordered pair counted, as LAGraph). Paths
    are counted forward level by level over the frontier's rows (``T(j,s) = A(i,j) *
    F(i,s)``), dependencies pushed back the same way. float64.

    On several threads the sources are shared out: each thread runs Brandes' loop for its
    share on one thread, and the shares' dependencies are summed (the sources are
    independent; a push from all of them at once on several threads would add into a
    private copy of the ``n x width`` counts per thread at every level)."""
    g = as_graph(graph)
    batch = np.atleast_1d(np.asarray(sources, dtype=np.int64))
    for s in batch:
        _vertex(g, s)
    workers = min(resolve_threads(threads), batch.size)
    if workers <= 1:
        return _brandes(g, batch, threads)
    g.pattern("float64"), g.reverse("float64")  # made once, before the workers read them
    with ThreadPoolExecutor(workers) as pool:
        shares = list(pool.map(lambda share: _brandes(g, share, 1), np.array_split(batch, workers)))
    return np.sum(shares, axis=0)


def _brandes(g: Graph, batch: np.ndarray, threads: int | None) -> np.ndarray:
    """`betweenness` from the sources ``batch`` together, their kernels on ``threads``.

    The bookkeeping between kernels reads only what a level reached: the (vertex,
    source) pairs are flat positions of the ``n x width`` arrays, each level's found by
    scanning only its rows' out-neighbours where they are few, and kept as the level's
    list."""
    n = g.n
    width = batch.size
    a = g.pattern("float64")
    spread = graph_kernel("spread")
    paths = np.zeros(n * width)
    # each level's (vertex, source) pairs, as flat positions vertex * width + source
    level_pairs = [np.unique(batch * width + np.arange(width))]
    paths[level_pairs[0]] = 1.0
    seen = np.zeros(n * width, dtype=bool)
    seen[level_pairs[0]] = True
    degrees = g.degrees
    while True:
        pairs = level_pairs[-1]
        f = _pair_rows(n, width, pairs, paths[pairs])
        edges = _edges(f, degrees)
        counts = spread(A=a, F=f, threads=_threads_for(edges, n, threads)).reshape(-1)
        reached = _reached(a, f, edges, counts, width)
        fresh = reached[~seen[reached]]
        if not fresh.size:
            break
        seen[fresh] = True
        paths[fresh] = counts[fresh]
        level_pairs.append(fresh)
    dependency = np.zeros(n * width)
    reverse = g.reverse("float64")
    in_pos = reverse.levels[1].pos
    assert in_pos is not None
    in_degrees = np.diff(in_pos)
    for at in range(len(level_pairs) - 1, 0, -1):
        pairs = level_pairs[at]
        w = _pair_rows(n, width, pairs, (1.0 + dependency[pairs]) / paths[pairs])
        # A W: edges backwards (the reverse graph's degrees are the in-degrees)
        back = spread(A=reverse, F=w, threads=_threads_for(_edges(w, in_degrees), n, threads))
        back = back.reshape(-1)
        ups = level_pairs[at - 1]  # the pairs one level up
        dependency[ups] += back[ups] * paths[ups]
    dependency[batch * width + np.arange(width)] = 0.0
    return graph_kernel("total")(D=dependency.reshape(n, width), threads=1)


def _reached(a: Tensor, rows: Tensor, edges: int, counts: np.ndarray, width: int) -> np.ndarray:
    """The flat positions where a push of ``rows`` (an "sd" matrix, with ``edges`` out-
    edges in ``a``) left a nonzero in ``counts`` (path counts are positive), sorted: only
    among the rows' out-neighbours where they are fewer than ``a``'s rows, else by one
    scan of all."""
    if edges >= a.shape[0]:
        return np.flatnonzero(counts)
    held = rows.levels[0].crd
    pos, crd = a.levels[1].pos, a.levels[1].crd
    assert held is not None and pos is not None and crd is not None
    starts = pos[held].astype(np.int64)
    lengths = pos[held + 1] - starts
    # the rows' entries, gathered: each row's run of positions, laid end to end
    at = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(edges)
    marked = np.zeros(a.shape[1], dtype=bool)
    marked[crd[at]] = True
    near = np.flatnonzero(marked)
    flat = (near[:, None] * width + np.arange(width)).reshape(-1)
    return flat[counts[flat] != 0]


def _edges(rows: Tensor, degrees: np.ndarray) -> int:
    """The out-edges of the rows an "sd" matrix holds, by the graph's ``degrees``."""
    held = rows.levels[0].crd
    assert held is not None
    return int(degrees[held].sum())


def _threads_for(edges: int, n: int, threads: int | None) -> int | None:
    """The threads of a push of ``edges`` edges into a dense output of ``n`` rows (of
    ``width`` each): one where they are fewer than ``n``. Threads add (or, min) into
    their own copies of the output (zeroed, then combined: ``n * width`` each), which a
    push of fewer edges than vertices does not repay; counted in elements, on any
    machine."""
    return 1 if edges < n else threads


def _pair_rows(n: int, width: int, pairs: np.ndarray, values: np.ndarray) -> Tensor:
    """The ``n x width`` matrix holding ``values`` at the flat positions ``pairs``
    (sorted), zero elsewhere, as the rows that hold any ("sd": compressed rows, dense
    columns)."""
    of = pairs // width
    starts = np.empty(of.size, dtype=bool)
    starts[:1] = True
    np.not_equal(of[1:], of[:-1], out=starts[1:])
    rows = of[starts]
    block = np.zeros(rows.size * width)
    # each pair's slot: its row's place among the rows, then its source
    slot = np.cumsum(starts)
    slot -= 1
    slot *= width
    slot += pairs
    slot -= of * width
    block[slot] = values
    idt = choose_index_dtype(None, (n,), ())
    pos = np.array([0, rows.size], dtype=idt)
    levels = (LevelStorage(pos, rows.astype(idt)), LevelStorage())
    return Tensor((n, width), _ROWS, levels, block, idt)  # trusted: rows sorted, distinct
