"""Kernels of lkat-lens: the fused RBF grid-linear operator and Gated Linear Attention ops, each beside its exact torch reference."""
