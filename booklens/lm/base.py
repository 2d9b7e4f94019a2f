"""What every backend returns, and helpers shared by backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from booklens.errors import LMError

DEFAULT_MAX_TOKENS = 1024


def lm_label(lm: Any) -> str:
    """The name records and terminal lines give an LM: a booklens LM's label, a DSPy LM's model
    string, or the string itself."""
    return str(getattr(lm, "label", None) or getattr(lm, "model", None) or lm)


class ContextWindowExceeded(LMError):
    """The prompt and the answer budget do not fit the model's context window."""


@dataclass
class Completion:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    # Prompt tokens the provider served from its own prompt cache (billed at its cached rate).
    provider_cached_tokens: int = 0
