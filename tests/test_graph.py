"""sparsec.graph's algorithms (issue 40) against networkx and scipy.sparse.csgraph on small
graphs: random ones, disconnected ones, self-loops, isolated vertices, a path, a star, and
an R-MAT graph; exact for the integer results, 1e-9 for PageRank and betweenness."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph

from sparsec.base.errors import InputError
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

INT64_MAX = np.iinfo(np.int64).max


def _symmetric(n: int, density: float, seed: int, loops: bool = False) -> sp.csr_array:
    a = sp.random_array((n, n), density=density, rng=np.random.default_rng(seed), format="csr")
    a = ((a + a.T) != 0).astype(np.int64).tolil()
    if not loops:
        a.setdiag(0)
    else:
        a.setdiag(np.random.default_rng(seed).random(n) < 0.3)
    a = sp.csr_array(a)
    a.eliminate_zeros()
    return a


def _graphs() -> list[tuple[str, sp.csr_array]]:
    path = sp.diags_array([np.ones(9), np.ones(9)], offsets=[-1, 1], shape=(10, 10))
    star = sp.lil_array((8, 8))
    star[0, 1:] = 1
    star[1:, 0] = 1
    two = sp.block_diag([_symmetric(12, 0.3, 5), _symmetric(9, 0.4, 6)], format="csr")
    return [
        ("random", _symmetric(40, 0.08, 0)),
        ("sparse, disconnected", _symmetric(50, 0.02, 1)),
        ("self-loops", _symmetric(30, 0.1, 2, loops=True)),
        ("isolated vertices", sp.csr_array((6, 6), dtype=np.int64)),
        ("two components", sp.csr_array(two, dtype=np.int64)),
        ("path", sp.csr_array(path, dtype=np.int64)),
        ("star", sp.csr_array(star, dtype=np.int64)),
        ("rmat", rmat(7, 4, seed=3)),
    ]


GRAPHS = _graphs()
IDS = [name for name, _ in GRAPHS]


def _levels(a: sp.csr_array, source: int) -> np.ndarray:
    hops = csgraph.shortest_path(a, unweighted=True, indices=source)
    return np.where(np.isinf(hops), -1, hops).astype(np.int64)


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_bfs_levels_and_parents(name, a):
    g = Graph(a)
    for source in range(0, a.shape[0], max(1, a.shape[0] // 4)):
        want = _levels(a, source)
        np.testing.assert_array_equal(bfs(g, source), want)
        levels, parents = bfs(g, source, parents=True, threads=2)
        np.testing.assert_array_equal(levels, want)
        reached = np.flatnonzero(want > 0)
        assert parents[source] == source and (parents[want < 0] == -1).all()
        # a parent is an in-neighbour one level up: the least one (min_second)
        for v in reached:
            ups = [u for u in a[:, [v]].nonzero()[0] if want[u] == want[v] - 1]
            assert parents[v] == min(ups)


def test_bfs_push_and_pull_agree_on_a_large_frontier():
    a = rmat(11, 16, seed=1)  # frontiers large enough to pull
    source = int(np.argmax(np.diff(a.indptr)))
    np.testing.assert_array_equal(bfs(a, source), _levels(a, source))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["bool", "int8", "int64", "float32", "float64"])
def test_bfs_in_every_type_and_direction_on_a_directed_graph(dtype, threads):
    # directed graphs whose frontiers pull (the reverse graph, the unvisited rows' mask)
    # and push: a hub (vertex 0, with a loop) reaches every vertex in one push of more
    # edges than vertices, which runs on the threads (private copies of the output)
    n = 600
    hub = sp.random_array((n, n), density=0.03, rng=np.random.default_rng(7), format="lil")
    hub[0, :] = 1
    a_hub = sp.csr_array(hub != 0, dtype=np.int64)
    cases = [(rmat(11, 8, seed=4, undirected=False), None), (a_hub, 0)]
    for a, hub_source in cases:
        _bfs_agrees(a, hub_source, dtype, threads)


def _bfs_agrees(a: sp.csr_array, only: int | None, dtype: str, threads: int) -> None:
    g = Graph(a)
    for source in (int(np.argmax(np.diff(a.indptr))), 5) if only is None else (only,):
        want = _levels(a, source)
        np.testing.assert_array_equal(bfs(g, source, dtype=dtype, threads=threads), want)
        levels, parents = bfs(g, source, parents=True, threads=threads)
        np.testing.assert_array_equal(levels, want)
        reached = np.flatnonzero(want > 0)
        assert (want[parents[reached]] == want[reached] - 1).all()
        assert (a[parents[reached], reached] != 0).all()


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_sssp_matches_dijkstra(name, a):
    w = a.copy()
    w.data = np.random.default_rng(0).integers(1, 20, w.nnz)
    w = sp.csr_array(w + w.T)  # symmetric integer weights
    got = sssp(w, 0)
    want = csgraph.dijkstra(w, indices=0)
    assert got.dtype == np.int64
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[finite], want[finite].astype(np.int64))
    assert (got[~finite] == INT64_MAX).all()
    floats = sssp(sp.csr_array(w * 0.5), 0)
    np.testing.assert_allclose(floats, want * 0.5, rtol=1e-12)


def test_sssp_is_exact_beyond_float64():
    big = 2**60
    w = sp.csr_array(
        (np.array([big, 1, big]), (np.array([0, 1, 2]), np.array([1, 2, 3]))), shape=(4, 4)
    )
    assert sssp(w, 0).tolist() == [0, big, big + 1, 2 * big + 1]


def test_sssp_reports_a_negative_cycle():
    w = sp.csr_array(
        (np.array([1, -3, 1]), (np.array([0, 1, 2]), np.array([1, 2, 1]))), shape=(3, 3)
    )
    with pytest.raises(InputError, match="negative cycle"):
        sssp(w, 0)


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_triangles_match_networkx(name, a):
    simple = sp.csr_array(a)
    simple.setdiag(0)
    simple.eliminate_zeros()
    want = sum(nx.triangles(nx.from_scipy_sparse_array(simple)).values()) // 3
    assert triangles(a) == want  # self-loops are ignored
    assert triangles(Graph(a), threads=2) == want
    assert triangles(a, method="sandia") == want  # the masked plus_pair product, summed


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_connected_components_are_labelled_by_their_least_vertex(name, a):
    _, label = csgraph.connected_components(a, directed=False)
    want = np.array([np.flatnonzero(label == label[v]).min() for v in range(a.shape[0])])
    np.testing.assert_array_equal(connected_components(a), want)


def _lagraph_pagerank(a: sp.csr_array, d: float, tol: float, iters: int) -> np.ndarray:
    """LAGraph's PageRank written directly with scipy (sinks spread over every vertex)."""
    n = a.shape[0]
    deg = np.diff(a.indptr).astype(float)
    r = np.full(n, 1.0 / n)
    for _ in range(iters):
        w = np.divide(r, deg, out=np.zeros(n), where=deg > 0)
        new = (1 - d) / n + d * (a.T @ w + r[deg == 0].sum() / n)
        done = np.abs(new - r).sum() <= tol
        r = new
        if done:
            break
    return r


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_pagerank_is_lagraphs_and_networkx(name, a):
    got = pagerank(a, tolerance=1e-10, iterations=200)
    want = _lagraph_pagerank(sp.csr_array(a, dtype=float), 0.85, 1e-10, 200)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)
    assert abs(got.sum() - 1) < 1e-9
    # networkx spreads a sink's rank the same way
    nxr = nx.pagerank(nx.from_scipy_sparse_array(a), alpha=0.85, tol=1e-13, max_iter=1000)
    np.testing.assert_allclose(
        pagerank(a, tolerance=1e-13, iterations=1000),
        [nxr[v] for v in range(a.shape[0])],
        rtol=1e-6,
    )


@pytest.mark.parametrize("name,a", GRAPHS, ids=IDS)
def test_betweenness_matches_networkx(name, a):
    n = a.shape[0]
    sources = sorted({0, n // 3, n - 1})
    g = nx.from_scipy_sparse_array(a)
    g.remove_edges_from(nx.selfloop_edges(g))
    # networkx halves an undirected graph's pairs; LAGraph counts each ordered pair
    want = nx.betweenness_centrality_subset(g, sources, list(g.nodes), normalized=False)
    got = betweenness(a, sources)
    np.testing.assert_allclose(got, [2 * want[v] for v in range(n)], rtol=1e-9, atol=1e-12)


def test_directed_bfs_and_betweenness_follow_the_edges():
    a = sp.csr_array((np.ones(4, dtype=np.int64), ([0, 1, 2, 0], [1, 2, 3, 2])), shape=(5, 5))
    assert bfs(a, 0).tolist() == [0, 1, 1, 2, -1]
    assert bfs(a, 3).tolist() == [-1, -1, -1, 0, -1]
    want = nx.betweenness_centrality_subset(
        nx.from_scipy_sparse_array(a, create_using=nx.DiGraph),
        [0, 1],
        list(range(5)),
        normalized=False,
    )
    np.testing.assert_allclose(betweenness(a, [0, 1]), [want[v] for v in range(5)])


def test_bad_arguments_are_clear_errors():
    a = _symmetric(5, 0.5, 0)
    with pytest.raises(InputError, match="not a vertex"):
        bfs(a, 5)
    with pytest.raises(InputError, match="square"):
        bfs(sp.csr_array((3, 4)), 0)
    with pytest.raises(InputError, match="weights"):
        sssp(sp.csr_array(a, dtype=bool), 0)
