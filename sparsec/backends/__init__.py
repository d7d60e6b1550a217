"""Code generation: loop IR → target source (C now; CUDA shares the printer)."""

from .c import Generated, generate

__all__ = ["Generated", "generate"]
