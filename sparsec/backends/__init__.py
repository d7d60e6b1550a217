"""Code generation's last step: finished loop IR printed as target source (C, CUDA), one
printer over a target table. `sparsec.pipeline` decides what is printed."""

from .generated import Generated, Launch

__all__ = ["Generated", "Launch"]
