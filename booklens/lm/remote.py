"""Any LiteLLM model string as a backend; `api_base` points it at an OpenAI-compatible server."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from booklens.errors import LMError
from booklens.lm.base import DEFAULT_MAX_TOKENS, Completion, first_line as _first_line


class LiteLLMBackend:
    """Any LiteLLM model string; `api_base` points it at an OpenAI-compatible server."""

    TRANSIENT_RETRIES = 5

    def __init__(self, model: str, api_base: str | None = None, timeout: float = 600.0, backoff_base: float = 1.0):
        self.model = model
        self.api_base = api_base
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.context_window = self._context_window()

    @property
    def name(self) -> str:
        return self.model

    def _context_window(self) -> int | None:
        import litellm

        try:
            info = litellm.get_model_info(self.model)
            return info.get("max_input_tokens") or info.get("max_tokens")
        except Exception:
            return None

    def validate(self) -> None:
        """Fail before any work when the model string or its key cannot work."""
        import litellm

        try:
            litellm.get_llm_provider(self.model, api_base=self.api_base)
        except Exception:
            raise LMError(
                f"unknown model '{self.model}': use 'local' or a LiteLLM model string such as openai/gpt-4o-mini"
            ) from None
        if self.api_base:
            return  # self-hosted servers usually need no key
        try:
            env = litellm.validate_environment(model=self.model)
        except Exception:
            return
        missing = env.get("missing_keys") or []
        if missing:
            raise LMError(f"missing API key for '{self.model}': set {', '.join(missing)} in the environment")

    def complete(self, request: dict[str, Any]) -> Completion:
        import litellm

        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=request["messages"],
            temperature=request.get("temperature"),
            max_tokens=request.get("max_tokens") or DEFAULT_MAX_TOKENS,
            timeout=self.timeout,
            num_retries=0,
        )
        if self.api_base:
            kwargs["api_base"] = self.api_base
            # Self-hosted OpenAI-compatible servers usually take any key; the client insists on one.
            kwargs.setdefault("api_key", os.environ.get("BOOKLENS_API_KEY") or _provider_key(self.model) or "none")
        if request.get("response_format") is not None:
            kwargs["response_format"] = request["response_format"]
        transient = (
            litellm.RateLimitError,
            litellm.Timeout,
            litellm.APIConnectionError,
            litellm.InternalServerError,
            litellm.ServiceUnavailableError,
        )
        for attempt in range(self.TRANSIENT_RETRIES + 1):
            try:
                response = litellm.completion(**kwargs)
                break
            except litellm.ContextWindowExceededError:
                raise LMError(f"the prompt is larger than the context window of '{self.model}'") from None
            except litellm.AuthenticationError:
                raise LMError(f"authentication failed for '{self.model}': check its API key in the environment") from None
            except litellm.NotFoundError:
                raise LMError(f"model '{self.model}' was not found by its provider") from None
            except transient as exc:
                if attempt == self.TRANSIENT_RETRIES:
                    raise LMError(
                        f"'{self.model}' kept failing after {attempt + 1} tries: {type(exc).__name__}: {_first_line(exc)}"
                    ) from None
                time.sleep(min(30.0, self.backoff_base * 2**attempt) * (1 + random.random() * 0.25))
            except litellm.BadRequestError as exc:
                raise LMError(f"'{self.model}' rejected the request: {_first_line(exc)}") from None
        choice = response.choices[0]
        usage = getattr(response, "usage", None)
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            cost = None
        return Completion(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason or "stop",
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            cost=cost or None,
        )


def _provider_key(model: str) -> str | None:
    provider = model.split("/", 1)[0].upper()
    return os.environ.get(f"{provider}_API_KEY")

