"""Kernels of lkat-lens: the fused RBF grid-linear operator and GLA ops, each beside its exact torch reference."""
