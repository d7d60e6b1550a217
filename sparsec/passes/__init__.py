"""Passes over the loop IR, IR -> IR, run in the order `sparsec.pipeline` lists per
target: register tiles, prefetched gathers, interleaved reductions, column bands and depth
blocks, stream prefetching, CUDA column coarsening."""
