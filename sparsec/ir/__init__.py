"""The loop IR (`nodes`) the lowerer builds, the passes rewrite and the printers render,
and the generic walks over it (`visit`)."""
