"""The leaves every stage shares: the error types, the data and cache directories, and what a
kernel is compiled for. Nothing here imports anything of sparsec but this folder."""
