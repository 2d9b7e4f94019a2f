"""Language-model backends behind one `--lm` string.

`local` (the default) runs SmolLM2-135M-Instruct in-process with llama.cpp (`embedded`); any
other value is a LiteLLM model string (`remote`). Every call goes through `BooklensLM`
(`model`), which caches completed calls on disk (`cache`), counts calls and tokens per run and
per step (`usage`), and formats DSPy signatures for the backends (`adapter`).

Names are loaded on first use, so `from booklens.lm import record_usage` costs no dspy or
litellm import: commands that fail on their arguments, and `--help`, stay instant.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "usage": ("usage_step", "current_step", "usage_scope", "StepUsage", "UsageTracker", "record_usage", "describe_calls",
              "work_between"),
    "cache": ("CallCache", "default_cache_dir"),
    "base": ("Completion", "DEFAULT_MAX_TOKENS", "ContextWindowExceeded", "lm_label"),
    "embedded": ("LOCAL_LM", "LOCAL_LABEL", "LOCAL_MODEL_NAME", "LOCAL_CONTEXT_WINDOW", "LocalBackend",
                 "local_model_path", "resolve_lm_name", "lm_name_label", "refuse_server_options_for_embedded"),
    "remote": ("LiteLLMBackend", "STRUCTURED_MODES", "check_api_base", "resolve_api_base"),
    "ratelimit": ("RateLimiter",),
    "adapter": ("BooklensAdapter", "plain_output_field", "adapter_unless_configured"),
    "model": ("BooklensLM", "last_finish_reason", "last_stop", "UNFINISHED", "filter_stopped", "make_lm",
              "make_backend", "lm_context_window", "served_context_window",
              "local_backend", "configure", "current_lm", "Attempted", "predict_with_retries", "Reasks", "fresh_try",
              "hearing_calls", "forget_answers",
              "resolve_structured", "structured_mode", "structured_of", "make_limiter", "rate_limits"),
    "pool": ("LMPool", "FixedLMPool", "named_server"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'booklens.lm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"booklens.lm.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
