"""The explorer's tabs: each module lays out one view and registers its callbacks."""

from . import attributions, edges, gates, overview, probes, tokens, training

VIEWS = (overview, edges, gates, tokens, attributions, probes, training)

__all__ = ["VIEWS", "attributions", "edges", "gates", "overview", "probes", "tokens", "training"]
