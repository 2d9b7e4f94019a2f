"""booklens: declarative DSPy programs for book-length summarization and its evaluation."""

import importlib.util
import os

__version__ = "0.1.0"


def _offline_defaults() -> None:
    # LiteLLM would otherwise fetch a price map at import time and retry for
    # seconds when offline; its bundled copy is enough.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # tiktoken downloads cl100k_base on first use; LiteLLM ships that file.
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        spec = importlib.util.find_spec("litellm")
        if spec and spec.submodule_search_locations:
            tokenizers = os.path.join(
                list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers"
            )
            if os.path.isdir(tokenizers):
                os.environ["TIKTOKEN_CACHE_DIR"] = tokenizers
    # Models that ship inside pip packages are loaded from disk, never a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_offline_defaults()
