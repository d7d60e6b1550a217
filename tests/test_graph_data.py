"""Graph data and the GraphBLAS baselines: `sparsec.graph.rmat` (Graph500's R-MAT with a
fixed seed) draws the same matrix for a seed, symmetric, without duplicates or (unless asked)
self loops, with Graph500's edge count and a skewed degree distribution; each baseline of
`bench.graph_baselines` (python-graphblas, LAGraph's algorithms) agrees with networkx or
`scipy.sparse.csgraph` exactly (integers) or to 1e-9 (floats) on small graphs: disconnected,
with self loops, without edges, a path, small R-MATs (and a directed one, with its
transpose)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from sparsec.base.errors import InputError
from sparsec.graph import rmat

INT_MAX = np.iinfo(np.int64).max


def _keys(A: sp.csr_array) -> np.ndarray:
    """Each stored entry's ``row * n + column``, in storage order."""
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    return rows * A.shape[1] + A.indices


def _same(A: sp.csr_array, B: sp.csr_array) -> bool:
    return (
        A.shape == B.shape
        and np.array_equal(A.indptr, B.indptr)
        and np.array_equal(A.indices, B.indices)
        and np.array_equal(A.data, B.data)
    )


# --- the R-MAT generator ---------------------------------------------------------------


def test_rmat_is_determined_by_its_seed() -> None:
    assert _same(rmat(8, seed=3), rmat(8, seed=3))
    assert not _same(rmat(8, seed=3), rmat(8, seed=4))
    weighted = rmat(8, seed=3, weights=(1, 50))
    assert _same(weighted, rmat(8, seed=3, weights=(1, 50)))
    assert not np.array_equal(weighted.data, rmat(8, seed=4, weights=(1, 50)).data)


@pytest.mark.parametrize("scale", [1, 3, 10])
def test_rmat_is_a_symmetric_pattern_without_loops_or_duplicates(scale: int) -> None:
    A = rmat(scale)
    n = 2**scale
    assert isinstance(A, sp.csr_array)
    assert A.shape == (n, n) and A.dtype == np.int64
    assert np.all(A.data == 1)
    assert (A != A.T).nnz == 0
    assert not A.diagonal().any()
    assert np.all(np.diff(_keys(A)) > 0)  # rows sorted, no entry twice
    assert A.has_canonical_format


def test_rmat_self_loops_and_directed() -> None:
    loops = rmat(8, self_loops=True)
    assert loops.diagonal().any() and (loops != loops.T).nnz == 0
    assert (loops - sp.diags_array(loops.diagonal(), dtype=np.int64) != rmat(8)).nnz == 0
    directed = rmat(8, undirected=False)
    assert (directed != directed.T).nnz > 0
    assert not directed.diagonal().any()
    assert np.all(np.diff(_keys(directed)) > 0)
    assert np.all(np.diff(_keys(rmat(8, undirected=False, self_loops=True))) > 0)


def test_rmat_weights_are_drawn_in_range_and_symmetric() -> None:
    W = rmat(9, weights=(3, 7), self_loops=True)
    assert W.dtype == np.int64
    assert W.data.min() == 3 and W.data.max() == 7
    assert set(np.unique(W.data)) == {3, 4, 5, 6, 7}
    assert (W != W.T).nnz == 0
    pattern = rmat(9, self_loops=True)
    assert np.array_equal(W.indices, pattern.indices)
    assert np.array_equal(W.indptr, pattern.indptr)
    assert np.array_equal(rmat(6, weights=(5, 5)).data, np.full(rmat(6).nnz, 5))
    directed = rmat(8, undirected=False, weights=(-2, 2))
    assert directed.data.min() == -2 and directed.data.max() == 2


def test_rmat_edge_count_and_skewed_degrees() -> None:
    scale, edge_factor = 12, 8
    A = rmat(scale, edge_factor)
    generated = edge_factor * 2**scale
    # duplicates and loops merged away: Graph500's R-MAT keeps most of its edges
    assert 0.5 * generated < A.nnz / 2 <= generated
    degree = np.diff(A.indptr)
    assert degree.max() > 10 * degree.mean()
    assert (degree == 0).sum() > 0.1 * 2**scale  # many vertices no edge reaches
    # the labels are permuted: the hub is not vertex 0 (as it is without the permutation)
    hubs = {int(np.argmax(np.diff(rmat(10, seed=s).indptr))) for s in range(3)}
    assert hubs != {0} and len(hubs) > 1
    # fewer edges with a smaller edge factor; a uniform R-MAT (a=b=c=d) is not skewed
    assert rmat(scale, 2).nnz < A.nnz
    uniform = np.diff(rmat(scale, edge_factor, a=0.25, b=0.25, c=0.25).indptr)
    assert uniform.max() < 3 * uniform.mean()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"scale": 0}, "scale must be an integer from 1 to 30"),
        ({"scale": 31}, "scale must be"),
        ({"scale": 2.0}, "scale must be"),
        ({"scale": True}, "scale must be"),
        ({"scale": 4, "edge_factor": 0}, "edge_factor must be an integer >= 1"),
        ({"scale": 4, "a": 0.0}, "probability a must be a number strictly between 0 and 1"),
        ({"scale": 4, "c": -0.1}, "probability c"),
        ({"scale": 4, "a": 0.5, "b": 0.3, "c": 0.2}, "a + b + c must be below 1"),
        ({"scale": 4, "seed": -1}, "seed must be a non-negative integer"),
        ({"scale": 4, "weights": (1,)}, "weights must be None"),
        ({"scale": 4, "weights": (1.0, 2.0)}, "weights must be None"),
        ({"scale": 4, "weights": (5, 1)}, "needs lo <= hi"),
    ],
)
def test_rmat_refuses_bad_arguments(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(InputError, match="rmat: ") as err:
        rmat(**kwargs)
    assert words in str(err.value)


# --- the GraphBLAS baselines -------------------------------------------------------------


@pytest.fixture(scope="module")
def gbl() -> ModuleType:
    pytest.importorskip("graphblas")
    from bench import graph_baselines

    return graph_baselines


def _symmetric(n: int, edges: list[tuple[int, int]], weights: list[int] | None = None) -> Any:
    rows = np.array([e[0] for e in edges], dtype=np.int64)
    cols = np.array([e[1] for e in edges], dtype=np.int64)
    w = np.ones(len(edges), np.int64) if weights is None else np.array(weights, np.int64)
    off = rows != cols
    A = sp.coo_array(
        (
            np.concatenate([w, w[off]]),
            (np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]])),
        ),
        shape=(n, n),
    )
    return sp.csr_array(A)


def _graphs() -> dict[str, sp.csr_array]:
    """Small symmetric weighted graphs (int64 weights >= 1)."""
    return {
        "disconnected": _symmetric(
            9,
            [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 6), (6, 3), (4, 6)],
            [2, 3, 9, 1, 4, 1, 5, 7],
        ),  # a triangle, a square with a chord, two isolated vertices (7, 8)
        "self-loops": _symmetric(
            6,
            [(0, 0), (0, 1), (1, 2), (2, 2), (2, 3), (3, 0), (3, 4), (4, 4), (1, 3)],
            [1, 2, 2, 5, 1, 7, 3, 2, 4],
        ),
        "no-edges": sp.csr_array((5, 5), dtype=np.int64),
        "path": _symmetric(7, [(i, i + 1) for i in range(6)], [1, 2, 3, 4, 5, 6]),
        "rmat-7": rmat(7, 8, seed=5, weights=(1, 9)),
        "rmat-8-loops": rmat(8, 4, seed=6, self_loops=True, weights=(1, 20)),
    }


GRAPHS = _graphs()
NAMES = list(GRAPHS)


def _sources(A: sp.csr_array) -> list[int]:
    """Three sources: vertex 0, the last vertex and the vertex of highest degree."""
    n = A.shape[0]
    return sorted({0, n - 1, int(np.argmax(np.diff(A.indptr)))})


def _nx(A: sp.csr_array, directed: bool = False) -> Any:
    nx = pytest.importorskip("networkx")
    kind = nx.DiGraph if directed else nx.Graph
    return nx.from_scipy_sparse_array(A, create_using=kind)


def _hops(A: sp.csr_array, source: int, directed: bool = False) -> np.ndarray:
    d = csgraph.shortest_path(A, directed=directed, unweighted=True, indices=source)
    return np.where(np.isinf(d), -1, d).astype(np.int64)


@pytest.mark.parametrize("name", NAMES)
def test_bfs_levels(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    G = gbl.to_graphblas(A, bool)
    for s in _sources(A):
        assert np.array_equal(gbl.bfs_levels(G, s), _hops(A, s))
        assert np.array_equal(gbl.bfs_levels(G, s, degree=gbl.degrees(G)), _hops(A, s))


def _check_parents(A: sp.csr_array, source: int, parent: np.ndarray, directed: bool) -> None:
    level = _hops(A, source, directed)
    assert parent.dtype == np.int64
    assert np.array_equal(parent == -1, level == -1)
    assert parent[source] == source
    dense = A.toarray() != 0
    for v in np.flatnonzero((parent >= 0) & (np.arange(len(parent)) != source)):
        p = parent[v]
        assert dense[p, v], (v, p)  # an edge from the parent
        assert level[p] == level[v] - 1, (v, p)


@pytest.mark.parametrize("name", NAMES)
def test_bfs_parents_are_valid(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    G = gbl.to_graphblas(A, bool)
    for s in _sources(A):
        _check_parents(A, s, gbl.bfs_parents(G, s), directed=False)


def test_a_big_frontier_switches_the_bfs_to_pull(gbl: ModuleType) -> None:
    """On an R-MAT the search pulls at least once (and still agrees)."""
    A = rmat(12)
    G = gbl.to_graphblas(A, bool)
    hub = int(np.argmax(np.diff(A.indptr)))
    pulls = []
    choose = gbl._Direction.choose

    def traced(self: Any, *args: Any) -> bool:
        push: bool = choose(self, *args)
        pulls.append(not push)
        return push

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gbl._Direction, "choose", traced)
        assert np.array_equal(gbl.bfs_levels(G, hub), _hops(A, hub))
        _check_parents(A, hub, gbl.bfs_parents(G, hub), directed=False)
    assert any(pulls) and not all(pulls)


@pytest.mark.parametrize("name", NAMES)
def test_sssp(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    Gi = gbl.to_graphblas(A, np.int64)
    quarter = sp.csr_array(A, dtype=np.float64) * 0.25 + sp.csr_array(A != 0) * 0.1
    Gf = gbl.to_graphblas(quarter)
    for s in _sources(A):
        ref = csgraph.dijkstra(A, directed=True, indices=s)
        got = gbl.sssp(Gi, s)
        assert got.dtype == np.int64
        reached = np.isfinite(ref)
        assert np.array_equal(got[reached], ref[reached].astype(np.int64))
        assert np.all(got[~reached] == INT_MAX)
        ref_f = csgraph.dijkstra(quarter, directed=True, indices=s)
        got_f = gbl.sssp(Gf, s)
        assert got_f.dtype == np.float64
        np.testing.assert_allclose(got_f, ref_f, rtol=1e-9, atol=1e-9)
        assert np.array_equal(np.isinf(got_f), ~reached)


def test_sssp_refuses_a_negative_cycle(gbl: ModuleType) -> None:
    G = gbl.to_graphblas(_symmetric(3, [(0, 1), (1, 2)], [1, -1]))
    with pytest.raises(ValueError, match="negative cycle"):
        gbl.sssp(G, 0)


def _pagerank_nx(A: sp.csr_array, directed: bool = False) -> np.ndarray:
    nx = pytest.importorskip("networkx")
    ranks = nx.pagerank(_nx(A != 0, directed), alpha=0.85, tol=1e-15, max_iter=2000, weight=None)
    return np.array([ranks[i] for i in range(A.shape[0])])


@pytest.mark.parametrize("name", NAMES)
def test_pagerank(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    G = gbl.to_graphblas(A, bool)
    got = gbl.pagerank(G, 0.85, 2000, tol=1e-14)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, _pagerank_nx(A), rtol=0, atol=1e-9)
    assert got.sum() == pytest.approx(1.0, abs=1e-12)


def test_pagerank_stops_at_its_tolerance(gbl: ModuleType) -> None:
    """LAGraph's defaults (tol 1e-4, at most 100 steps) stop early, within about tol."""
    A = GRAPHS["rmat-7"]
    G = gbl.to_graphblas(A, bool)
    exact = _pagerank_nx(A)
    assert np.abs(gbl.pagerank(G) - exact).sum() < 1e-3
    assert np.abs(gbl.pagerank(G, iterations=1, tol=0) - exact).sum() > 1e-3


def _triangles_nx(A: sp.csr_array) -> int:
    nx = pytest.importorskip("networkx")
    g = _nx(A)
    g.remove_edges_from(list(nx.selfloop_edges(g)))
    return sum(nx.triangles(g).values()) // 3


@pytest.mark.parametrize("name", NAMES)
def test_triangles(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    count = gbl.triangles(gbl.to_graphblas(A, bool))
    assert isinstance(count, int)
    assert count == _triangles_nx(A)


def test_triangle_counts_by_hand(gbl: ModuleType) -> None:
    assert gbl.triangles(gbl.to_graphblas(GRAPHS["disconnected"], bool)) == 3
    assert gbl.triangles(gbl.to_graphblas(GRAPHS["path"], bool)) == 0


@pytest.mark.parametrize("name", NAMES)
def test_connected_components(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    n = A.shape[0]
    k, labels = csgraph.connected_components(A, directed=False)
    smallest = np.full(k, n)
    np.minimum.at(smallest, labels, np.arange(n))
    got = gbl.connected_components(gbl.to_graphblas(A, bool))
    assert got.dtype == np.int64
    assert np.array_equal(got, smallest[labels])


def _betweenness_nx(A: sp.csr_array, sources: list[int] | None) -> np.ndarray:
    nx = pytest.importorskip("networkx")
    g = _nx(A != 0)
    if sources is None:
        bc = nx.betweenness_centrality(g, normalized=False)
    else:
        bc = nx.betweenness_centrality_subset(g, sources, list(g), normalized=False)
    # networkx halves an undirected graph's sums; LAGraph's is the sum over the sources
    return 2 * np.array([bc[i] for i in range(A.shape[0])])


@pytest.mark.parametrize("name", NAMES)
def test_betweenness(gbl: ModuleType, name: str) -> None:
    A = GRAPHS[name]
    G = gbl.to_graphblas(A, bool)
    n = A.shape[0]
    got = gbl.betweenness(G, np.arange(n))
    assert got.dtype == np.float64 and got.shape == (n,)
    np.testing.assert_allclose(got, _betweenness_nx(A, None), rtol=1e-9, atol=1e-9)
    batch = _sources(A)
    np.testing.assert_allclose(
        gbl.betweenness(G, batch), _betweenness_nx(A, batch), rtol=1e-9, atol=1e-9
    )


def test_betweenness_by_hand(gbl: ModuleType) -> None:
    """On the path 0-1-...-6 from every source, vertex v is between 2 * v * (6 - v) pairs."""
    got = gbl.betweenness(gbl.to_graphblas(GRAPHS["path"], bool), range(7))
    assert np.array_equal(got, [2.0 * v * (6 - v) for v in range(7)])


def test_directed_graphs_with_their_transpose(gbl: ModuleType) -> None:
    """A directed R-MAT: BFS (pushes and pulls on the transpose), SSSP along the edges,
    PageRank (the transpose's products, sinks spread) and betweenness."""
    nx = pytest.importorskip("networkx")
    A = rmat(8, 8, seed=2, undirected=False, weights=(1, 9))
    G, Gi = gbl.to_graphblas(A, bool), gbl.to_graphblas(A, np.int64)
    T = G.T.new()
    for s in _sources(A):
        assert np.array_equal(gbl.bfs_levels(G, s, transpose=T), _hops(A, s, directed=True))
        _check_parents(A, s, gbl.bfs_parents(G, s, transpose=T), directed=True)
        ref = csgraph.dijkstra(A, directed=True, indices=s)
        got = gbl.sssp(Gi, s)
        assert np.array_equal(np.where(np.isinf(ref), -1, ref), np.where(got == INT_MAX, -1, got))
    got = gbl.pagerank(G, 0.85, 2000, tol=1e-14, transpose=T)
    np.testing.assert_allclose(got, _pagerank_nx(A, directed=True), rtol=0, atol=1e-9)
    bc = nx.betweenness_centrality(_nx(A != 0, directed=True), normalized=False)
    np.testing.assert_allclose(
        gbl.betweenness(G, np.arange(A.shape[0]), transpose=T),
        [bc[i] for i in range(A.shape[0])],
        rtol=1e-9,
        atol=1e-9,
    )


def test_baselines_refuse_a_vertex_out_of_range(gbl: ModuleType) -> None:
    G = gbl.to_graphblas(GRAPHS["path"], bool)
    for call in (gbl.bfs_levels, gbl.bfs_parents, gbl.sssp):
        with pytest.raises(ValueError, match="not a vertex"):
            call(G, 7)
    with pytest.raises(ValueError, match="not a vertex"):
        gbl.betweenness(G, [0, -1])
