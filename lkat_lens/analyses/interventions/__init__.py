"""Causal interventions on the hook points: activation patching, ablations with controls, direct logit
attribution and the logit lens; GLA gate clamps and state cuts (`gates`), KAN edge ablations, pruning and symbolic
swaps (`edges`), measured by `effects`. One module per job; each line below re-exports one module's public names."""

from .ablation import *  # noqa: F403
from .corruptions import *  # noqa: F403
from .edges import *  # noqa: F403
from .effects import *  # noqa: F403
from .gates import *  # noqa: F403
from .logit_attribution import *  # noqa: F403
from .patching import *  # noqa: F403
from .sweep import *  # noqa: F403
