"""Causal interventions: hooks that change a forward pass, and the change of the label logit and accuracy they cause.

`effects` runs many interventions per forward pass; `gates` clamps GLA forget gates and cuts the recurrent state;
`edges` ablates, prunes and symbolically swaps KAN edge functions.
"""
