"""Pure computations on a model and inputs; each returns typed results, never figures."""
