"""The middle end: the typed kernel description (`spec`), the iteration graph and loop
order (`order`), merge lattices (`lattice`), the scheduling language (`commands`) applied
to a loop nest (`plan`), and a sparse output's entry bound (`bound`)."""
