"""Tensors and their storage: level formats with their level functions, output layouts,
storage validation, packing, random tensors, conversions from scipy and torch, files."""
