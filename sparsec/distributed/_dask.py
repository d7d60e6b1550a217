"""Dask, imported on first use: sparsec imports without it (`pip install 'sparsec[distributed]'`)."""

from __future__ import annotations

from typing import Any

from ..base.errors import SparsecError

INSTALL = "pip install 'sparsec[distributed]'"


def distributed() -> Any:
    """The `distributed` module, or a SparsecError saying how to install it."""
    try:
        import distributed as dd
    except ImportError:
        raise SparsecError(
            f"sparsec.distributed runs on Dask, which is not installed: {INSTALL}"
        ) from None
    return dd


def client_of(client: Any = None) -> Any:
    """``client`` if given, else the current Dask client, else a SparsecError saying how to
    make one."""
    dd = distributed()
    if client is not None:
        return client
    try:
        return dd.get_client()
    except ValueError:
        raise SparsecError(
            "no Dask client: make one first (distributed.Client() for a LocalCluster on this "
            "machine, Client('scheduler-address') for a cluster) or pass client="
        ) from None


def lost(futures: list[Any]) -> list[int]:
    """Indices of futures whose data is gone (their worker died and nothing can redo them)."""
    return [i for i, f in enumerate(futures) if f.status in ("lost", "cancelled", "error")]
