"""crag-dspy: Corrective RAG as an optimizable DSPy program.

Importing this package starts nothing: no model is loaded and no store is opened until asked.
"""

import os

# Offline by default: LiteLLM (used by DSPy) otherwise fetches a model-price map from the internet on first
# use, which stalls 5 s and warns on machines without network. An explicit user setting wins.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "true")

from .app import build_crag, load_program
from .citations import Citation
from .config import CRAGConfig, JudgeView, LMCalls
from .documents import from_documents, ingest
from .domain import Domain, DomainDataError, load_domain
from .faults import CRAGRunError, LMUnavailableError, RetrievalError, RunCancelled
from .module import CRAG, Thresholds
from .protocols import Passage, Retriever, WebResult, WebSearch, WebSearchError
from .routing import Action, decide_action
from .settings import Settings
from .validation import QuestionError, normalize_question
from .version import __version__ as __version__

__all__ = [
    "CRAG",
    "Action",
    "CRAGConfig",
    "CRAGRunError",
    "Citation",
    "Domain",
    "DomainDataError",
    "JudgeView",
    "LMCalls",
    "LMUnavailableError",
    "Passage",
    "QuestionError",
    "RetrievalError",
    "Retriever",
    "RunCancelled",
    "Settings",
    "Thresholds",
    "WebResult",
    "WebSearch",
    "WebSearchError",
    "build_crag",
    "decide_action",
    "from_documents",
    "ingest",
    "load_domain",
    "load_program",
    "normalize_question",
]
