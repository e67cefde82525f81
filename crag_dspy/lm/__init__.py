"""Language-model backends: the embedded llama.cpp model or any LiteLLM model string, one code path."""

from .factory import LMConfigError, build_lm, lm_identity
from .weights import EMBEDDED_MODELS, WeightsError

__all__ = ["EMBEDDED_MODELS", "LMConfigError", "WeightsError", "build_lm", "lm_identity"]
