"""Policy: what sparsec decides from facts outside the expression (the host machine)."""
