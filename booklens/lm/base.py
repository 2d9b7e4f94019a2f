"""What every backend returns, and helpers shared by backends."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from booklens.errors import LMError, setting_name

DEFAULT_MAX_TOKENS = 1024


def lm_label(lm: Any) -> str:
    """The name records and terminal lines give an LM: a booklens LM's label, a DSPy LM's model
    string, or the string itself."""
    return str(getattr(lm, "label", None) or getattr(lm, "model", None) or lm)


def lm_server(lm: Any) -> str | None:
    """The server URL an LM is reached at (`--api-base`) as records name it, without user, password
    or query (either may hold a key); None for a provider's own endpoint, the embedded model or a
    name: a booklens LM's backend's, or a DSPy LM's `api_base` argument."""
    backend = getattr(lm, "backend", None)
    if backend is not None:
        url = getattr(backend, "api_base", None)
    else:
        kwargs = getattr(lm, "kwargs", None)
        url = kwargs.get("api_base") if isinstance(kwargs, dict) else None
    if not url:
        return None
    from booklens.lm.remote import public_url

    return public_url(url)


def lm_planned_window(lm: Any) -> int | None:
    """The window an LM's prompts are planned for when one was set for it (a judge's --context-window:
    `BooklensLM.planning_for`), else None (the model's own). A judge's calibration is keyed by it: with
    fewer demos or less evidence, the judge is measured as another."""
    window = getattr(lm, "planned_window", None)
    return window if isinstance(window, int) and not isinstance(window, bool) else None


def window_setting(lm: Any, option: str | None) -> dict[str, Any]:
    """How a check names the window `lm` plans for (`refuse_misfits`' keywords): `option` when a
    command's option set it (`planning_for`), with the model's own window, which it may not exceed;
    nothing when the window is the model's."""
    if option is None or lm_planned_window(lm) is None:
        return {}
    return set_window(option, getattr(getattr(lm, "backend", None), "context_window", None))


def set_window(option: str, model_window: int | None) -> dict[str, Any]:
    """`window_setting` where `option` set the window, below the model's `model_window` (None: unknown)."""
    return {"option": option, "model_window": model_window}


class ContextWindowExceeded(LMError):
    """The prompt and the answer budget do not fit the model's context window; `window` is that
    window in tokens when the server's words gave it."""

    def __init__(self, message: str, window: int | None = None):
        super().__init__(message)
        self.window = window


# The end of a context overflow's line (`booklens.lm.remote.context_window_message`) where nothing
# more is known of what to change: which input is too large differs by command.
CONTEXT_ADVICE = "use smaller inputs, or a model or server with a larger context"


def refuse_larger_window(window: int, model_window: int | None, option: str | None = None, *,
                         default: bool = False) -> None:
    """A one-line error when a window to plan for, set by `option` (or its `default`), is larger than
    the model's (`model_window`; None is unknown, and not checked): prompts planned for it would be
    refused. Without `option`, the summarizer's window as the caller spells it (`setting_name`)."""
    if model_window and window > model_window:
        option = option or setting_name("--context-window")
        which = f"the default context window {window}" if default else f"{option} {window}"
        raise LMError(f"{which} is larger than this model's {model_window}: set {option} to {model_window} or less")


def planned_window_advice(exc: ContextWindowExceeded, planned: int, what: str,
                          option: str | None = None) -> ContextWindowExceeded:
    """`exc`, told which option to set when the server's window is smaller than the `planned` one
    `what` (a program) sized its prompts for: a self-hosted server's window is unknown until it
    refuses a prompt, and the default plans for more than many are started with."""
    if not exc.window or exc.window >= planned:
        return exc
    fact = str(exc).removesuffix(f": {CONTEXT_ADVICE}")
    option = option or setting_name("--context-window")
    return ContextWindowExceeded(f"{fact}: {what} plans for a {planned}-token window{SETTING_ADVICE}{option} to "
                                 f"{exc.window} or less", window=exc.window)


# How `planned_window_advice` names the setting to change: a failure that says it fails the same way
# on a rerun of the same command (`advises_setting`).
SETTING_ADVICE = "; set "


def advises_setting(failure: str | None) -> bool:
    """Whether a recorded failure names a setting to change before a rerun."""
    return SETTING_ADVICE in (failure or "")


@dataclass
class Completion:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    # Prompt tokens the provider served from its own prompt cache (billed at its cached rate).
    provider_cached_tokens: int = 0
    # The tokens the context window left for the answer, when that was less than max_tokens (the
    # embedded model then writes only as far as the window goes): a larger budget cannot help.
    answer_room: int | None = None
    # The reasoning tokens of an answer that was reasoning only (empty content, the thinking sent
    # apart as `reasoning_content`), so its failure can say so; 0 otherwise.
    reasoning_only_tokens: int = 0


def stored_completion(value: Any) -> bool:
    """Whether a call cache entry (a decoded `Completion.__dict__`) can be read as a Completion: an
    object whose text is a string and whose other known fields have their types. One that cannot (a
    hand-edited or damaged entry) is a call not finished, asked again."""
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return False

    def count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    checks = {"finish_reason": lambda x: isinstance(x, str), "prompt_tokens": count, "completion_tokens": count,
              "provider_cached_tokens": count, "reasoning_only_tokens": count,
              "answer_room": lambda x: x is None or count(x),
              "cost": lambda x: x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))}
    return all(check(value[name]) for name, check in checks.items() if name in value)


def sample_seed(request: dict[str, Any]) -> int:
    """The seed of a request's sample: its attempt (booklens' re-asks), mixed with DSPy's rollout id
    (an optimizer's fresh sample) and its sample number (one of `n`) when it has them, kept below
    2**31, which every server takes."""
    attempt = int(request.get("attempt") or 0)
    rollout, sample = request.get("rollout"), request.get("sample")
    if rollout is None and sample is None:
        return attempt
    return zlib.crc32(f"{attempt}/{rollout}/{sample}".encode()) & 0x7FFFFFFF
