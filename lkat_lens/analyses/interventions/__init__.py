"""Causal interventions on the hook points: activation patching, ablations with controls, direct logit
attribution and the logit lens. One module per job; each line below re-exports one module's public names."""

from .ablation import *  # noqa: F403
from .corruptions import *  # noqa: F403
from .logit_attribution import *  # noqa: F403
from .patching import *  # noqa: F403
from .sweep import *  # noqa: F403
