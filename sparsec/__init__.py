"""sparsec: a sparse tensor-algebra compiler (index notation → C kernels), after TACO.

k = sparsec.kernel("y(i) = A(i,j) * x(j)", formats={"A": "csr"})
y = k(A=A, x=x)          # A: scipy/torch/sparsec.Tensor, x: numpy/torch
k.check(A=A, x=x)        # compare with torch.einsum on dense inputs
print(k.source)          # the generated C
"""

from . import io as io  # sparsec.io.load / save after a plain `import sparsec`
from .api import array as _array  # noqa: F401  (registers sparsec.Tensor's operators)
from .api.check import CheckResult
from .api.einsum import einsum
from .api.kernel import Kernel, kernel
from .base.errors import (
    CheckError,
    CompileError,
    DTypeError,
    FormatError,
    InputError,
    LoweringError,
    NotationError,
    ParseError,
    ScheduleError,
    ShapeError,
    SparsecError,
    StorageError,
)
from .tensors.formats import Format, parse_format
from .tensors.mapped import MappedTensor
from .tensors.maps import MappedFormat
from .tensors.tensor import Tensor, as_tensor, random

__version__ = "0.1.0"

__all__ = [
    "CheckError",
    "CheckResult",
    "CompileError",
    "DTypeError",
    "Format",
    "FormatError",
    "InputError",
    "Kernel",
    "MappedFormat",
    "MappedTensor",
    "LoweringError",
    "NotationError",
    "ParseError",
    "ScheduleError",
    "ShapeError",
    "SparsecError",
    "StorageError",
    "Tensor",
    "as_tensor",
    "einsum",
    "kernel",
    "parse_format",
    "random",
]
