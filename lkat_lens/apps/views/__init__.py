"""The explorer's tabs: each module lays out one view and registers its callbacks."""

from . import attributions, edges, gates, interventions, overview, probes, tokens, training

VIEWS = (overview, edges, gates, tokens, attributions, probes, interventions, training)

__all__ = ["VIEWS", "attributions", "edges", "gates", "interventions", "overview", "probes", "tokens", "training"]
