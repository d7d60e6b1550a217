"""The compiler's pipeline: spec + schedule policy -> lower -> passes -> printer -> `Generated`.

One function per target lowers the kernel per schedule it considers (the user's commands
plus the policy's default, or each GPU candidate until one lowers), runs the target's passes
over the loop IR (`lists`) and hands the bodies to its printer, which decides nothing:
`c.generate` (a sparse output's C source holds up to three lowerings: the symbolic phase,
the numeric phase, and a single pass) and `cuda.generate_cuda`."""

from __future__ import annotations

from .c import generate
from .cuda import generate_cuda
from .shared import lower_serially

__all__ = ["generate", "generate_cuda", "lower_serially"]
