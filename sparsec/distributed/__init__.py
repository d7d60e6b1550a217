"""sparsec on Dask (``pip install 'sparsec[distributed]'``): sparse tensors cut into parts on
the workers (`DistributedTensor`) and kernels that run part by part (`kernel`).

    import sparsec.distributed as sd
    from distributed import Client
    client = Client()                          # or Client("scheduler-address")
    A = sd.read_mtx("graph.mtx")               # parsed on the workers, balanced by nonzeros
    k = sd.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"})
    y = k(A=A, x=x)                            # numpy on the driver

Dask itself is imported on first use, so ``import sparsec`` never needs it.
"""

from .dkernel import DistributedKernel, kernel
from .files import read_mtx, read_tns
from .model import Model, model
from .partition import Partition
from .tensor import DistributedTensor, from_dask_array, from_scipy, from_tensor, open_dir

open = open_dir  # noqa: A001  (sd.open(dir): the directory `DistributedTensor.save` writes)

__all__ = [
    "DistributedKernel",
    "DistributedTensor",
    "Partition",
    "from_dask_array",
    "from_scipy",
    "from_tensor",
    "kernel",
    "model",
    "Model",
    "open",
    "read_mtx",
    "read_tns",
]
