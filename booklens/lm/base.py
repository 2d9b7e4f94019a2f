"""What every backend returns, and helpers shared by backends."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 1024


@dataclass
class Completion:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
