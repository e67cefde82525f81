"""Language-model backends: the embedded llama.cpp model or any LiteLLM model string, one code path.

The rest of the project sees this package through these names only, and an LM only as a ``dspy.LM``
(:func:`build_lm`). The embedded model is served by :class:`OpenAIServer`, an OpenAI-compatible HTTP
server over a :class:`ChatEngine`, which answers with :class:`Completion` objects; benchmarks serve
fake engines through the same server.
"""

from .embedded import ENGINE_CHOICES, ENGINES, MISSING_ENGINE, resolve_engine
from .engine import describe_engine
from .factory import LMConfigError, build_lm, lm_identity
from .ik_engine import Completion, TokenLogprob
from .openai_server import ChatEngine, OpenAIServer
from .weights import EMBEDDED_MODELS, WeightsError

__all__ = [
    "EMBEDDED_MODELS",
    "ENGINES",
    "ENGINE_CHOICES",
    "MISSING_ENGINE",
    "ChatEngine",
    "Completion",
    "LMConfigError",
    "OpenAIServer",
    "TokenLogprob",
    "WeightsError",
    "build_lm",
    "describe_engine",
    "lm_identity",
    "resolve_engine",
]
