"""Graph data and algorithms (issue 40): LAGraph's basic algorithms written as loops over
index-notation kernels (`algorithms`), and `rmat`, Graph500's R-MAT / Kronecker graphs
with a fixed seed."""

from .algorithms import (
    Graph,
    betweenness,
    bfs,
    connected_components,
    pagerank,
    sssp,
    triangles,
)
from .rmat import rmat

__all__ = [
    "Graph",
    "betweenness",
    "bfs",
    "connected_components",
    "pagerank",
    "rmat",
    "sssp",
    "triangles",
]
