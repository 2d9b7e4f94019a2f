"""The DSPy LM every program talks to (`BooklensLM`), how a `--lm` string becomes one, and
predictions with bounded re-asks."""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import dspy

from booklens.errors import BooklensError, LMError, first_line, kind_of, setting_name
from booklens.lm.adapter import BooklensAdapter
from booklens.lm.base import DEFAULT_MAX_TOKENS, Completion, ContextWindowExceeded, refuse_larger_window
from booklens.lm.cache import CACHE_FILE, CallCache, cache_folder
from booklens.lm.embedded import LOCAL_LM, LocalBackend, check_lm_strings, missing_model_error, resolve_lm_name
from booklens.lm.remote import (STRUCTURED_MODES, LiteLLMBackend, model_context_window, resolve_api_base,
                                 resolve_server, shown_url, unreachable)
from booklens.lm.usage import UsageTracker
from booklens.parallel import raise_if_stopped, survive_ctrl_c

# The finish reason of the last completion in this thread, so programs can see cut-off answers.
_last_finish_reason: contextvars.ContextVar[str] = contextvars.ContextVar("booklens_finish", default="stop")


def last_finish_reason() -> str:
    """'stop' or 'length' for the most recent LM call made by the current thread."""
    return _last_finish_reason.get()


# Why an answer stopped before the model finished it, by finish reason, in a message's words:
# at the token cap, or by the provider's content filter (OpenAI's and Azure's `content_filter`,
# which LiteLLM also reports for other providers' safety stops). Any other reason is a finished answer.
UNFINISHED = {"length": "cut off at the token limit", "content_filter": "stopped by the provider's content filter"}


def last_stop() -> str | None:
    """Why the current thread's most recent answer was left unfinished, a key of `UNFINISHED`
    ('length', 'content_filter'); None when the model finished it."""
    reason = _last_finish_reason.get()
    return reason if reason in UNFINISHED else None


def filter_stopped(what: str) -> str | None:
    """A check's complaint ('the {what} is unfinished') when the provider's content filter stopped the
    answer just read, else None: what it withheld may be the reason, the later items or the value's
    own words, so an answer that still parses is no finished one."""
    return f"the {what} is unfinished" if last_stop() == "content_filter" else None


# The answer room of the last completion in this thread (`Completion.answer_room`): set when the
# context window, not max_tokens, bounded its answer.
_last_answer_room: contextvars.ContextVar[int | None] = contextvars.ContextVar("booklens_room", default=None)


# The reasoning tokens of the last completion in this thread when it was reasoning only
# (`Completion.reasoning_only_tokens`), else 0.
_last_reasoning_only: contextvars.ContextVar[int] = contextvars.ContextVar("booklens_reasoning_only", default=0)


def last_reasoning_only() -> int:
    """The reasoning tokens of the current thread's most recent answer when it held only reasoning
    and no answer, else 0."""
    return _last_reasoning_only.get()


# The lists collecting the cached calls made in this context (see `hearing_calls`); blocks nest.
_calls_heard: contextvars.ContextVar[tuple[list[tuple[CallCache, str]], ...]] = contextvars.ContextVar(
    "booklens_calls_heard", default=())


@contextlib.contextmanager
def hearing_calls() -> Iterator[list[tuple[CallCache, str]]]:
    """Collect the cache entries of the LM calls made inside the block, so a program can drop the
    answers it ends up rejecting (`forget_answers`)."""
    heard: list[tuple[CallCache, str]] = []
    token = _calls_heard.set((*_calls_heard.get(), heard))
    try:
        yield heard
    finally:
        _calls_heard.reset(token)


def forget_answers(heard: list[tuple[CallCache, str]]) -> None:
    """Drop answers that were rejected in every try from the call cache. Kept, a rerun would
    replay the same rejected answers and fail again even after the server or model is fixed; the
    rejected answers of an item that a later try settled stay, so its rerun takes the same path."""
    by_cache: dict[int, tuple[CallCache, list[str]]] = {}
    for cache, key in heard:
        by_cache.setdefault(id(cache), (cache, []))[1].append(key)
    for cache, keys in by_cache.values():
        cache.forget(keys)


# Sampling settings a caller may give besides temperature and max_tokens (as DSPy's own LM passes
# them on): each changes the answer, so each goes to the backend and into the cache key.
SAMPLING_SETTINGS = ("stop", "top_p", "presence_penalty", "frequency_penalty")


class BooklensLM(dspy.BaseLM):
    """A DSPy LM over one backend, with the disk cache and usage accounting."""

    # Structured calls always carry their output schema; the backend decides how to send it.
    takes_output_schema = True

    def __init__(
        self,
        backend: Any,
        *,
        cache: CallCache | None = None,
        usage: UsageTracker | None = None,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        label: str | None = None,
        call_limit: Any = None,
    ):
        super().__init__(model=backend.name, temperature=temperature, max_tokens=max_tokens, cache=False)
        self.backend = backend
        self.call_cache = cache
        self.usage = usage or UsageTracker()
        self.label = label or backend.name
        # A semaphore shared by the LMs of a pool: at most that many backend calls in flight.
        self.call_limit = call_limit
        # The window prompts are planned for when the model's is unknown or larger than a user wants
        # (`planning_for`); None: the model's own.
        self.planned_window: int | None = None

    @property
    def context_window(self) -> int | None:
        return self.planned_window or getattr(self.backend, "context_window", None)

    def planning_for(self, window: int, option: str | None = None) -> "BooklensLM":
        """This LM (a view sharing its backend, cache and counters) with its prompts planned for a
        `window`-token context: a judge's window where the server states none (llama-cpp-python's),
        or a smaller one. Larger than the model's known window is a one-line error naming `option`."""
        refuse_larger_window(window, getattr(self.backend, "context_window", None), option)
        planned = self.view()
        planned.planned_window = window
        return planned

    @property
    def summary_settings(self) -> dict[str, Any]:
        """Summarizer settings the backend's model needs instead of the defaults (most need none)."""
        return dict(getattr(self.backend, "summary_settings", None) or {})

    def view(self, cls: type | None = None) -> "BooklensLM":
        """A new LM object (of `cls`, by default this one's class) that shares this one's backend,
        cache and counters, with kwargs and history of its own."""
        cls = cls or type(self)
        clone = cls.__new__(cls)
        clone.__dict__.update(self.__dict__)
        clone.kwargs = dict(self.kwargs)
        clone.history = []
        return clone

    def __deepcopy__(self, memo):
        # Optimizers copy programs and LMs; the backend, cache and counters are shared resources.
        return self.view()

    def _count(self, completion: Completion, *, cached: bool) -> dict[str, Any]:
        """Count a call in the LM's usage tracker and the usage scopes open here; returns the counts."""
        # The embedded model runs here: its calls cost nothing, which is a known price (the sweep's
        # estimate says $0 for it too), not an unknown one.
        cost = 0.0 if isinstance(self.backend, LocalBackend) else completion.cost
        counts = dict(cached=cached, prompt_tokens=completion.prompt_tokens,
                      completion_tokens=completion.completion_tokens, cost=cost,
                      provider_cached_tokens=completion.provider_cached_tokens)
        self.usage.record(**counts)
        return counts

    def forward(self, prompt=None, messages=None, **kwargs):
        raise_if_stopped()
        merged = {**self.kwargs, **kwargs}
        if messages is None:
            messages = [{"role": "user", "content": prompt}]
        messages = _sendable(messages)
        response_format = merged.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "text":
            response_format = None  # OpenAI's way of asking for free text: no format at all
        schema = None
        if isinstance(response_format, type):
            schema = response_format.model_json_schema()
        elif isinstance(response_format, dict):
            schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
        request = {
            "model": self.backend.name,
            "api_base": getattr(self.backend, "api_base", None),
            "messages": messages,
            "temperature": merged.get("temperature"),
            "max_tokens": merged.get("max_tokens"),
            "schema": schema,
            "attempt": int(merged.get("booklens_attempt") or 0),
        }
        sampling = {name: merged[name] for name in SAMPLING_SETTINGS if merged.get(name) is not None}
        if sampling:  # only when given, so the keys of calls without them stay as they were
            request["sampling"] = sampling
        if response_format is not None and schema is None:
            # JSON mode without a schema (an open-ended mapping) answers other than free text does.
            request["json_mode"] = True
        if merged.get("booklens_plain_output"):
            request["plain_output"] = merged["booklens_plain_output"]
        if merged.get("rollout_id") is not None:
            # DSPy's optimizers ask an LM copy with a new rollout id for a fresh sample (bootstrap
            # rounds, MIPROv2's proposals): a sample of its own, in the key and the seed.
            request["rollout"] = merged["rollout_id"]
        # DSPy asks for several samples with `n` (`Predict(..., n=3)`): one call each (llama.cpp's
        # server takes no `n`), the first as a lone call would be, the others samples of their own.
        samples = max(1, int(merged.get("n") or 1))
        answers = [self._ask(request if i == 0 else {**request, "sample": i}, response_format) for i in range(samples)]
        first = answers[0][0]
        _last_finish_reason.set(first.finish_reason)
        _last_answer_room.set(first.answer_room)
        _last_reasoning_only.set(first.reasoning_only_tokens)
        sent = [completion for completion, reused in answers if not reused]
        if sent and dspy.settings.usage_tracker is not None:
            # DSPy's own usage tracking (`dspy.track_usage`) is fed by its LM class only; what the
            # cache answered costs nothing now and is left out, as DSPy leaves out its own cache hits.
            dspy.settings.usage_tracker.add_usage(self.model, _usage(sent))
        return _openai_shaped(self.backend.name, [completion for completion, _ in answers],
                              all(reused for _, reused in answers))

    async def aforward(self, prompt=None, messages=None, **kwargs):
        # DSPy's async programs (`acall`): the same call on a worker thread, which takes this
        # context along (DSPy's settings, the usage step, a stop request).
        import asyncio

        return await asyncio.to_thread(self.forward, prompt=prompt, messages=messages, **kwargs)

    def _ask(self, request: dict[str, Any], response_format: Any) -> tuple[Completion, bool]:
        """One call: from the cache, else from the backend (and then cached); counted either way."""
        # The key says what was asked (messages, output schema, sampling), not how it travelled: the
        # structured-output dialect a server accepted is left out, so a resumed run that starts
        # again from the first dialect still finds every finished call. A backend whose own settings
        # change its answers (the embedded model) adds them.
        identity = getattr(self.backend, "cache_identity", None)
        key = CallCache.key_for({**request, "backend": identity} if identity else request)

        def call() -> dict[str, Any]:
            with self.call_limit if self.call_limit is not None else contextlib.nullcontext():
                raise_if_stopped()  # it may have waited for a slot while Ctrl-C came
                return self.backend.complete({**request, "response_format": response_format}).__dict__

        def fetch() -> tuple[dict[str, Any], bool]:
            if self.call_cache is not None:
                return self.call_cache.fetch(key, call, keep=_worth_keeping)
            return call(), False

        if self.call_cache is not None:
            for heard in _calls_heard.get():
                heard.append((self.call_cache, key))
        found = self.call_cache.get(key) if self.call_cache is not None else None
        value, reused = (found, True) if found is not None else survive_ctrl_c(fetch)
        completion = _completion(value)
        self._count(completion, cached=reused)
        return completion, reused


_SURROGATE = re.compile("[\ud800-\udfff]")


def _sendable(value: Any) -> Any:
    """`value` (messages, their parts) with each lone surrogate as U+FFFD. Python keeps a byte of a
    file name that is not UTF-8 as one (a book's title comes from its file name), and UTF-8 cannot
    encode it: neither the cache key nor a server could take the prompt."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, list):
        return [_sendable(v) for v in value]
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    return value


def _worth_keeping(value: dict[str, Any]) -> bool:
    """An empty answer is not kept: from a provider it is usually a glitch (an overloaded server, a
    filter), and a cached one would be replayed by every rerun, which could then never recover. One
    the token cap stopped is no glitch (a model that reasons first spent the cap on reasoning, and
    does so again): kept, so a rerun takes the path the run took, to a larger cap, at no cost. An
    answer rejected in every try leaves the cache all the same (`forget_answers`)."""
    return bool(str(value.get("text") or "").strip()) or value.get("finish_reason") == "length"


def _completion(value: dict[str, Any]) -> Completion:
    known = Completion.__dataclass_fields__
    return Completion(**{k: v for k, v in value.items() if k in known})


def _openai_shaped(model: str, completions: list[Completion], cache_hit: bool) -> SimpleNamespace:
    choices = [SimpleNamespace(message=SimpleNamespace(content=c.text, tool_calls=None, provider_specific_fields={}),
                               finish_reason=c.finish_reason, logprobs=None) for c in completions]
    costs = [c.cost for c in completions]
    cost = None if None in costs else sum(costs)
    return SimpleNamespace(choices=choices, usage=_usage(completions), model=model, cache_hit=cache_hit,
                           _hidden_params={"response_cost": cost})


def _usage(completions: list[Completion]) -> dict[str, int]:
    """The tokens of `completions` in OpenAI's usage shape."""
    prompt = sum(c.prompt_tokens for c in completions)
    answer = sum(c.completion_tokens for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer}


# ---------------------------------------------------------------------------
# Configuration


_LOCAL_BACKEND: LocalBackend | None = None
_LOCAL_LOCK = threading.Lock()


def local_backend() -> LocalBackend:
    """The process's one embedded backend: the model loads once, however many LMs use it."""
    global _LOCAL_BACKEND
    with _LOCAL_LOCK:
        if _LOCAL_BACKEND is None:
            backend = LocalBackend()
            if not os.path.exists(backend.model_path):
                raise missing_model_error(backend.model_path)
            _LOCAL_BACKEND = backend
        return _LOCAL_BACKEND


def lm_context_window(lm: str | None = None) -> int | None:
    """The context window of the model a `--lm` string names, as its backend would have it (None when
    unknown), without building the backend: no model loads and no key is needed."""
    name = resolve_lm_name(lm)
    return LocalBackend.context_window if name == LOCAL_LM else model_context_window(name)


# Servers that did not answer `served_context_window` in this process (the backends' own checks
# remember only the servers that did).
_SILENT_SERVERS: set[str] = set()


def unanswering_server(lm: str | None = None, api_base: str | None = None) -> tuple[str, str] | None:
    """(server as `shown_url` quotes it, why) for the server `lm` and `api_base` name (None for a
    provider's own endpoint) when it did not answer `served_context_window` in this process, or no
    connection to it opens now; else None. A run's calls there would fail, and a self-hosted server's
    window is unknown. No request is sent."""
    name = resolve_lm_name(lm)
    if name == LOCAL_LM:
        return None
    try:
        server = resolve_server(name, api_base)
    except BooklensError:
        return None
    if not server:
        return None
    if server in _SILENT_SERVERS:
        return shown_url(server), "no connection within the connect timeout"
    why = unreachable(server)
    return (shown_url(server), why) if why else None


def forget_servers() -> None:
    """Forget what this process learned of servers (their windows, dialects, which answered): a new
    process's view. For several commands run in one process, where a server started later may take
    the port of one that stopped (`booklens.testing.run_command`)."""
    from booklens.lm.remote import forget_learned

    _SILENT_SERVERS.clear()
    forget_learned()


def served_context_window(lm: str | None = None, api_base: str | None = None) -> int | None:
    """`lm_context_window` at the server `api_base` (else the environment's) names, as the LM a run
    builds there will have it: what a self-hosted server states (`LiteLLMBackend.context_window`: a
    GET of the routes `server_window` reads, no completion), asked once per server and process,
    so the backends built later do not ask again. No model loads and no key is needed. A server
    that does not answer, or a setting a backend refuses (named where the backend is built and
    checked), leaves the window as `lm_context_window` has it."""
    name = resolve_lm_name(lm)
    if name == LOCAL_LM:
        return LocalBackend.context_window
    try:
        server = resolve_server(name, api_base)
    except BooklensError:
        server = None
    if server and server not in _SILENT_SERVERS:
        try:
            return LiteLLMBackend(name, api_base=server).context_window
        except BooklensError:
            # no connection within the connect timeout (or a setting the backend's checks name later):
            # not waited for again by the next question
            _SILENT_SERVERS.add(server)
    return model_context_window(name)


def backend_settings(lm: str | None = None, *, api_base: str | None = None, structured: str | None = None,
                     rpm: int | None = None, tpm: int | None = None,
                     limited: bool = True) -> tuple[str, str, str | None]:
    """(model name, structured mode, server URL) from a `--lm` string and its options, else their
    BOOKLENS_* variables, with the rate limits unless not `limited` (a limiter made elsewhere paces
    the calls): each checked (one line for a bad value), whatever the model, and without building a
    backend, so a plan (`sweep --dry-run`) refuses what a run would without loading the embedded model."""
    check_lm_strings(lm, api_base)
    name = resolve_lm_name(lm)
    mode = resolve_structured(structured)
    api_base = resolve_api_base(api_base)  # a malformed server URL is an error even for the embedded model
    if limited:
        rate_limits(rpm, tpm)
    return name, mode, api_base


def make_backend(lm: str | None = None, *, api_base: str | None = None, structured: str | None = None,
                 rpm: int | None = None, tpm: int | None = None, limiter: Any = None, check_keys: bool = True) -> Any:
    """The backend a `--lm` string names, checked (unknown model, missing key unless not `check_keys`,
    bad structured mode, limits or server URL) before any call. A given `limiter` replaces the limits:
    `rpm`, `tpm` and BOOKLENS_RPM/TPM are not read (a Ray worker's come from the sweep's driver)."""
    name, mode, api_base = backend_settings(lm, api_base=api_base, structured=structured, rpm=rpm, tpm=tpm,
                                            limited=limiter is None)
    if limiter is None:
        limiter = make_limiter(rpm, tpm)
    if name == LOCAL_LM:
        return local_backend()
    backend = LiteLLMBackend(name, api_base=resolve_server(name, api_base), structured=mode, limiter=limiter)
    backend.validate(keys=check_keys)
    return backend


def make_lm(
    lm: str | None = None,
    *,
    api_base: str | None = None,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
    backend: Any = None,
    cache: CallCache | None = None,
    usage: UsageTracker | None = None,
    call_limit: Any = None,
    structured: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    limiter: Any = None,
    context_window: int | None = None,
) -> BooklensLM:
    """Build the LM for a `--lm` string ('local' or a LiteLLM model) with the disk cache
    (a given `cache`, `usage` tracker and `call_limit` are shared with other LMs).

    `structured` (auto|schema|json|off, or BOOKLENS_STRUCTURED) picks how LiteLLM backends are
    sent output schemas; `rpm`/`tpm` (or BOOKLENS_RPM/BOOKLENS_TPM) limit requests and tokens per
    minute over every thread that uses the LM, or pass one `limiter` (a `RateLimiter`) to share
    between LMs. The embedded model always decodes under the schema and has no rate limits.
    `context_window` is the window the judges plan their prompts for, when a server does not say
    its own (llama-cpp-python's) or a smaller one is wanted; larger than the model's is an error."""
    if backend is None:
        backend = make_backend(lm, api_base=api_base, structured=structured, rpm=rpm, tpm=tpm, limiter=limiter)
    if cache is None and use_cache:
        cache = CallCache(cache_folder(cache_dir) / CACHE_FILE)
    lm = BooklensLM(backend, cache=cache, usage=usage, call_limit=call_limit)
    return lm if context_window is None else lm.planning_for(context_window)


def resolve_structured(structured: str | None) -> str:
    """The structured-output mode from the option, else BOOKLENS_STRUCTURED, else 'auto'."""
    mode = ((structured or "").strip() or (os.environ.get("BOOKLENS_STRUCTURED") or "").strip() or "auto").lower()
    if mode not in STRUCTURED_MODES:
        raise LMError(f"unknown structured-output mode '{mode}': use one of {', '.join(STRUCTURED_MODES)}")
    return mode


def structured_mode(name: str, structured: str | None = None) -> str | None:
    """The structured-output mode the model `name` would be sent output schemas in, without building
    its backend: `structured`, else BOOKLENS_STRUCTURED, else 'auto'; None for the embedded model, which
    decodes under the schema whatever is set. `structured_of` reads it off a built LM."""
    return None if name == LOCAL_LM else resolve_structured(structured)


def structured_of(lm: Any) -> str | None:
    """The structured-output mode `lm` sends output schemas in (as `structured_mode` gives it); None
    for a backend that takes none (the embedded model, a scripted LM)."""
    return getattr(getattr(lm, "backend", None), "structured", None)


def rate_limits(rpm: int | None = None, tpm: int | None = None) -> dict[str, int]:
    """{'rpm': N, 'tpm': N} from the options, else BOOKLENS_RPM / BOOKLENS_TPM (checked); the
    limits not set are left out."""
    limits = {}
    for what, value in (("rpm", rpm), ("tpm", tpm)):
        source = setting_name(f"--{what}")  # the message names where the value came from
        if value is None:
            source = f"BOOKLENS_{what.upper()}"
            raw = os.environ.get(source, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                raise LMError(f"{source} must be a whole number, not '{raw}'") from None
        if value < 1:
            raise LMError(f"{source} must be at least 1 (got {value})")
        limits[what] = value
    return limits


def make_limiter(rpm: int | None = None, tpm: int | None = None) -> Any:
    """A RateLimiter for `rate_limits(rpm, tpm)`; None when neither is set."""
    limits = rate_limits(rpm, tpm)
    if not limits:
        return None
    from booklens.lm.ratelimit import RateLimiter

    return RateLimiter(**limits)


def require_lm(lm: Any, taker: str = "configure") -> Any:
    """`lm` when it is a DSPy LM, else a one-line error that says how to build one."""
    if not isinstance(lm, dspy.BaseLM):
        raise BooklensError(f"{taker} takes an LM, not {kind_of(lm)}: build one with booklens.lm.make_lm(...) "
                            "(or dspy.LM(...))")
    return lm


def configure(lm: BooklensLM | dspy.BaseLM) -> BooklensLM:
    """Make `lm` the LM of every DSPy program in this process, with booklens' adapter."""
    dspy.configure(lm=require_lm(lm), adapter=BooklensAdapter())
    return lm


def fresh_try(attempt: int, lm: Any = None) -> dict[str, int]:
    """The LM keyword that makes try number `attempt` (1, 2, ...) of a call a new sample instead of
    the cached answer of try 0, for the LM that answers it: `lm` (a predictor's own, `set_lm`), else
    the configured one. booklens LMs key their cache and the embedded model's seed on
    `booklens_attempt`; any other DSPy LM (a library user's `dspy.LM`) gets DSPy's own `rollout_id`,
    which it keeps out of the request it sends."""
    if not attempt:
        return {}
    lm = lm if lm is not None else dspy.settings.lm
    return {"rollout_id": attempt} if lm is not None and not isinstance(lm, BooklensLM) else {"booklens_attempt": attempt}


NO_LM = ("no language model configured: dspy.configure(lm=...) or booklens.lm.configure(booklens.lm.make_lm(...)) "
         "first, or run the program inside dspy.context(lm=...)")


def current_lm() -> Any:
    lm = dspy.settings.lm
    if lm is None:
        raise BooklensError(NO_LM)
    return lm


# ---------------------------------------------------------------------------
# Predictions that may not parse


@dataclass
class Attempted:
    """The outcome of a prediction with bounded re-asks: `prediction` or `error`."""

    prediction: Any = None
    error: str | None = None
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


# An answer cut off at its token limit is re-asked with twice the budget, up to this many times
# the first budget (and never past REASK_TOKEN_CAP), then recorded as failed.
REASK_GROWTH_CAP = 4
REASK_TOKEN_CAP = 8192


class Reasks:
    """How the tries of one call are asked: try 0 with `config`, each later one as a fresh sample at
    temperature 0.7, except after an answer cut off at the token limit, which is asked again with twice
    the answer budget at the same temperature (the model was on its way and needs room, not another
    answer). `rejected` says why a rejected answer was left unfinished and sets up the next try.
    Shared by `predict_with_retries` and the programs that run their own tries (batched coherence)."""

    def __init__(self, predictor: Any, config: dict[str, Any] | None):
        self.lm = getattr(predictor, "lm", None)
        self.first = _answer_budget(predictor, config)
        self.budget = self.first
        self.cap = max(self.first, min(self.first * REASK_GROWTH_CAP, REASK_TOKEN_CAP))
        self.cut_off = False
        self.sent = self.first

    @property
    def grown(self) -> bool:
        return self.budget != self.first

    def config(self, attempt: int, config: dict[str, Any] | None) -> dict[str, Any]:
        """The config of try `attempt` (0, 1, ...); it also forgets how the thread's last answer ended,
        so `rejected` reads this try's ending only."""
        call_config = dict(config or {})
        if attempt:
            call_config.update(fresh_try(attempt, self.lm))
            if not self.cut_off:
                call_config.setdefault("temperature", 0.7)
        if self.grown:
            call_config["max_tokens"] = self.budget
        self.sent = int(call_config.get("max_tokens") or self.first)
        _last_finish_reason.set("stop")
        _last_answer_room.set(None)
        _last_reasoning_only.set(0)
        return call_config

    def rejected(self) -> str:
        """After the answer of the try just made was rejected: what its complaint is prefixed with
        (why the answer was left unfinished, "" when the model finished it); the next try is set up."""
        stop = last_stop()
        room = _last_answer_room.get()
        self.cut_off = False
        if stop == "content_filter":
            # More room would not get past the filter: the next try is a fresh sample.
            return f"the answer was {UNFINISHED[stop]}: "
        if stop == "length" and room is not None:
            # The context window ended the answer, not its budget: more budget would bring the same
            # answer back, so the next try is a fresh sample, which may be shorter.
            return f"the answer was cut off where the context window ends ({room} tokens left after the prompt): "
        if stop == "length":
            self.cut_off = True
            self.budget = min(self.cap, self.sent * 2)
            return f"the answer was cut off at the token limit ({self.sent} tokens): "
        return ""


def predict_with_retries(
    predictor: Callable[..., Any],
    *,
    tries: int = 3,
    check: Callable[[Any], str | None] | None = None,
    config: dict[str, Any] | None = None,
    **inputs: Any,
) -> Attempted:
    """Call a DSPy predictor; re-ask (a fresh, uncached sample) when the answer does not
    parse or `check` returns a complaint. After `tries` it records the failure instead of
    guessing, so a bad answer is never silently turned into a default.

    A failed answer that was cut off at the token limit (finish reason 'length') is re-asked
    with twice the answer budget (up to 4x the first budget) at the same temperature: the model
    was on its way and needs room, not a different answer. One the context window cut off (the
    embedded model writes only as far as its window goes) is re-asked as any other failure.

    When every try fails, the rejected answers leave the call cache, so a rerun asks again."""
    if dspy.settings.lm is None and getattr(predictor, "lm", None) is None:
        # Not a failure of the model's answers to record and re-ask: there is no model.
        raise BooklensError(NO_LM)
    last_error = "no attempt made"
    reasks = Reasks(predictor, config)
    rejected: list[tuple[CallCache, str]] = []
    for attempt in range(tries):
        call_config = reasks.config(attempt, config)
        with hearing_calls() as heard:
            try:
                prediction = predictor(**inputs, config=call_config)
            except ContextWindowExceeded:
                if not reasks.grown:
                    raise
                forget_answers(rejected)
                return Attempted(error=f"{last_error}; a larger answer budget ({reasks.budget} tokens) does not fit "
                                       "the context window", attempts=attempt + 1)
            except (LMError, MemoryError):  # the backend's failure or the machine's, not the answer's
                raise
            except Exception as exc:  # DSPy raises several parse error types
                complaint = f"unparseable answer: {first_line(exc)}"
            else:
                complaint = check(prediction) if check else None
                if complaint is None:
                    return Attempted(prediction=prediction, attempts=attempt + 1)
                _forget_trace(prediction)
        rejected.extend(heard)
        last_error = reasks.rejected() + complaint
    forget_answers(rejected)
    return Attempted(error=last_error, attempts=tries)


def _answer_budget(predictor: Any, config: dict[str, Any] | None) -> int:
    """The max_tokens a call of `predictor` with `config` gets."""
    if config and config.get("max_tokens"):
        return int(config["max_tokens"])
    lm = getattr(predictor, "lm", None) or dspy.settings.lm
    return int(getattr(lm, "kwargs", {}).get("max_tokens") or DEFAULT_MAX_TOKENS)


def _forget_trace(prediction: Any) -> None:
    """Drop a rejected answer from DSPy's trace: optimizers turn traces into few-shot demos,
    and an answer the program refused must never be shown to the model as an example."""
    trace = dspy.settings.trace
    if not trace:
        return
    for i in range(len(trace) - 1, -1, -1):
        if trace[i][2] is prediction:
            del trace[i]
            return


def _loaded() -> None:
    from booklens.collector import lm_layer_loaded

    lm_layer_loaded()  # a command's collector, deferred while DSPy and LiteLLM loaded (booklens.collector)


_loaded()
