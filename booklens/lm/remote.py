"""Any LiteLLM model string as a backend; `api_base` points it at an OpenAI-compatible server.

What goes on the wire besides the messages:

- The output schema of every structured step, in the first dialect the backend takes
  (`structured="auto"`): OpenAI's `json_schema` response format for self-hosted servers and for
  models LiteLLM says support it; `{"type": "json_object", "schema": ...}` (llama-cpp-python's
  server) when a server refuses that; no response format at all when it refuses both, which
  leaves the prompt's JSON instructions and the caller's parse-and-re-ask. A refusal is learned
  once per server and remembered for the rest of the process. Until a server has answered a
  structured request, one such request goes to it at a time: the others wait for the dialect it
  settles on, so a refused dialect is sent once, not once per call in flight (`_take_dialect_turn`).
- `cache_prompt: true` for OpenAI-compatible servers given by `api_base` (llama.cpp keeps the
  evaluated prompt prefix; servers that do not know the field ignore it, and one that refuses it
  is not sent it again).
- `num_ctx` for Ollama's own API (`ollama/`, `ollama_chat/`), which otherwise cuts a prompt longer
  than its small default window from the front without an error (`ollama_window`).
- Cache-control markers on the shared prefix (system message and the message before the last)
  for Claude models on the routes with explicit prompt caching that LiteLLM's model table lists as
  taking it, through LiteLLM's `cache_control_injection_points`.

Faults: rate limits, overload, timeouts and dropped connections are retried with bounded
exponential backoff and jitter (a `Retry-After` header sets the delay), then stop with one line;
a connection refused by a server that never answered is one line at once; everything else that
cannot succeed on a retry (bad key, unknown model, a prompt larger than the context) is one line.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from typing import Any, Callable, Iterable

from booklens.errors import LMError, keep_secret, redacted, setting_name
from booklens.lm.base import CONTEXT_ADVICE, DEFAULT_MAX_TOKENS, Completion, ContextWindowExceeded, sample_seed
from booklens.parallel import pause, raise_if_stopped

log = logging.getLogger("booklens.lm")

STRUCTURED_MODES = ("auto", "schema", "json", "off")
# The order `auto` falls back in when a server refuses a dialect.
DIALECTS = ("schema", "json", "off")
# Servers people run themselves: they get the output schema without asking LiteLLM's model map.
SELF_HOSTED_PROVIDERS = {"hosted_vllm", "ollama", "ollama_chat", "llamafile", "lm_studio"}
# Ollama's own API, which takes the context window per request as `num_ctx` (its /v1 does not).
OLLAMA_PROVIDERS = {"ollama", "ollama_chat"}
OLLAMA_ROOT = "http://127.0.0.1:11434"  # where messages say Ollama's API usually is
# A prompt's token count is estimated with LiteLLM's tokenizer, which may count fewer tokens than the
# model's own (Llama 2's and Mistral's count about a quarter more): a window must hold this much more.
OLLAMA_TOKEN_MARGIN = 1.25
# Where `cache_prompt` may go (with an api_base): the OpenAI-compatible route llama.cpp servers use.
CACHE_PROMPT_PROVIDERS = {"openai", "custom_openai", "openai_like"}
TRANSIENT_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 529}
# A Retry-After longer than this is not waited out: the run stops and resumes later from the cache.
MAX_RETRY_AFTER = 600.0
# How long one request may take before it counts as timed out (and is retried); BOOKLENS_TIMEOUT
# sets it, for a CPU server reading a long prompt, say.
DEFAULT_TIMEOUT = 600.0
# The longest wait a request can be given: the clocks below it (Python's, in nanoseconds in 64 bits)
# overflow past about 9.2e9 s, and a request given more failed before it left, as a dropped connection.
MAX_TIMEOUT = 1e9


# How long a connection to the LM's server (--api-base, or the provider's variable: `resolve_server`)
# may take to open before the server counts as not answering: a host that drops packets (down, or a
# firewall) would otherwise cost a whole request timeout per try. BOOKLENS_CONNECT_TIMEOUT sets it.
DEFAULT_CONNECT_TIMEOUT = 30.0


def connect_timeout() -> float:
    """BOOKLENS_CONNECT_TIMEOUT, else DEFAULT_CONNECT_TIMEOUT; a one-line `LMError` for a value that
    is not a number of seconds above 0."""
    raw = os.environ.get("BOOKLENS_CONNECT_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT:
        raise LMError(f"BOOKLENS_CONNECT_TIMEOUT must be a number of seconds above 0, not '{raw}'")
    return value


def request_timeout(seconds: float | None = None) -> float:
    """`seconds`, else BOOKLENS_TIMEOUT, else DEFAULT_TIMEOUT; a one-line `LMError` for a value
    that is not a number of seconds above 0, or is above MAX_TIMEOUT."""
    source, raw = "timeout", seconds
    if raw is None:
        source, raw = "BOOKLENS_TIMEOUT", os.environ.get("BOOKLENS_TIMEOUT", "").strip() or None
        if raw is None:
            return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LMError(f"{source} must be a number of seconds above 0, not '{raw}'")
    if value > MAX_TIMEOUT:
        raise LMError(f"{source} must be at most {MAX_TIMEOUT:.0f} seconds (about 31 years; the clocks a request is "
                      f"timed by count no further), not '{raw}'")
    return value

# What each server was found to accept, by (provider, api_base or model), for this process.
_learned: dict[tuple[str, str], dict[str, Any]] = {}
_learned_lock = threading.Lock()
# Wakes the calls that wait for a server's first structured answer (`_take_dialect_turn`).
_dialect_settled = threading.Condition(_learned_lock)
# How often a call waiting for that answer looks whether it was asked to stop (Ctrl-C).
STOP_CHECK_INTERVAL = 0.05
_window_lock = threading.Lock()
# The most of a server's answer read when asking for its window: a model list or llama.cpp's props.
WINDOW_ANSWER_LIMIT = 4_000_000


def check_api_base(api_base: str | None, what: str = "--api-base") -> str | None:
    """`api_base` stripped, its scheme in small letters and without a trailing `/` (None when not
    given), or a one-line `LMError` naming the setting (`what`) when it is not an http:// or https://
    URL with a host. Without a scheme LiteLLM does not fail: its client retries connection errors
    for about 40 s before saying so. One server is one URL: the calls' cache keys and the run
    records' digests hold it, so `.../v1/` after `.../v1` must not redo every call."""
    from urllib.parse import urlsplit, urlunsplit

    if api_base is None or not api_base.strip():
        return None
    url = api_base.strip()
    try:
        parts = urlsplit(url)
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        valid = False
    if not valid:
        raise LMError(f"{what} needs an http:// or https:// URL such as http://127.0.0.1:8000/v1 "
                      f"(got {shown_url(url)!r})")
    # (the host's case is left: lowering it would lower a password written before it too)
    return urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), parts.query, parts.fragment))


# A URL's user and password ('user:password@'), with or without its scheme, at the start of a string.
_LEADING_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")


def shown_url(url: str) -> str:
    """`url` as a message may quote it, whether or not it is a valid URL: without user and password,
    and its query or fragment as '?...' (either may hold a key)."""
    query = _query_of(url)
    return _LEADING_USERINFO.sub(r"\1", url[: len(url) - len(query)]) + ("?..." if query else "")


def public_url(url: str) -> str:
    """`url` without user, password, query or fragment: what a message may show of a URL whose
    query may hold a key."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"  # an IPv6 address, which urlsplit gives without its brackets
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "the URL"


def resolve_api_base(api_base: str | None = None) -> str | None:
    """The server an LM talks to: `api_base`, else BOOKLENS_API_BASE, checked (`check_api_base`)."""
    if api_base is not None and api_base.strip():
        return check_api_base(api_base)
    return check_api_base(os.environ.get("BOOKLENS_API_BASE"), "BOOKLENS_API_BASE")


# Providers whose LiteLLM route adds the endpoint's path to the api_base as text ('{api_base}/chat/completions',
# '/api/chat', '/v1/messages', ...), so that a query string in the URL swallows the path and every
# request goes to the server's bare path: such a URL is refused before any call. (Azure's routes merge
# the URL's query, `?api-version=...`, into the request instead, and take it.) A query therefore never
# tells two servers of these providers apart; for Azure's it names an API version of the same
# deployment. So records and run digests name a server without its query (which may hold a key), and
# the call cache, which keys on the whole URL, keeps such calls apart all the same.
PATH_AFTER_URL_PROVIDERS = {
    "openai", "custom_openai", "text-completion-openai", "hosted_vllm", "ollama", "ollama_chat", "llamafile",
    "lm_studio", "anthropic", "groq", "mistral", "together_ai", "deepseek", "openrouter", "gemini", "xai",
    "fireworks_ai", "huggingface", "databricks",
}


def _query_of(url: str) -> str:
    """The query string and fragment of `url` ('?...' or '#...'), '' when it has neither."""
    cut = [i for i in (url.find("?"), url.find("#")) if i >= 0]
    return url[min(cut):] if cut else ""


# Where LiteLLM finds a provider's server when no api_base is given. A server named there is as
# much the LM's identity as --api-base (the call cache key, records, calibrations, cache_prompt).
PROVIDER_BASE_VARIABLES = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_BASE"),
    "anthropic": ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"),  # in LiteLLM's order
    "hosted_vllm": ("HOSTED_VLLM_API_BASE",),
    "ollama": ("OLLAMA_API_BASE",),
    "ollama_chat": ("OLLAMA_API_BASE",),
    "llamafile": ("LLAMAFILE_API_BASE",),
    "lm_studio": ("LM_STUDIO_API_BASE",),
}


def provider_api_base(model: str) -> str | None:
    """The server the provider's own variable names for `model` (e.g. OPENAI_BASE_URL for
    `openai/...`), checked as --api-base is; None when unset."""
    provider = model.split("/", 1)[0] if "/" in model else ""
    for variable in PROVIDER_BASE_VARIABLES.get(provider, ()):
        if (os.environ.get(variable) or "").strip():
            return check_api_base(os.environ[variable], variable)
    return None


def resolve_server(model: str, api_base: str | None = None) -> str | None:
    """The server a LiteLLM model is reached at: `api_base`, else BOOKLENS_API_BASE, else the
    provider's own variable (`provider_api_base`); None for the provider's own endpoint. The one
    rule for the call cache key, records and calibrations."""
    return resolve_api_base(api_base) or provider_api_base(model)


def model_context_window(model: str) -> int | None:
    """Input tokens a LiteLLM model takes, from LiteLLM's model map (None when it does not know the
    model: a self-hosted server's). What a backend works within, known without building one."""
    import litellm

    provider, _, name = model.partition("/")
    if provider in OLLAMA_PROVIDERS:
        # LiteLLM's table names Ollama's models once, as ollama/. Its table only: its lookup by name asks
        # an Ollama server (OLLAMA_API_BASE or localhost, not --api-base) for the window the model was
        # trained for, often 128K, which the judges would fill with evidence.
        info = litellm.model_cost.get(f"ollama/{name}") or {}
        return info.get("max_input_tokens") or info.get("max_tokens") or None
    try:
        info = litellm.get_model_info(model)
        return info.get("max_input_tokens") or info.get("max_tokens")
    except Exception:
        return None


# The hosts of providers' own APIs: a server named there (a config that spells out OpenAI's URL) is
# billed at the list price, as the default endpoint is.
PROVIDER_HOSTS = {
    "openai": "api.openai.com", "text-completion-openai": "api.openai.com", "anthropic": "api.anthropic.com",
    "gemini": "generativelanguage.googleapis.com", "mistral": "api.mistral.ai", "groq": "api.groq.com",
    "deepseek": "api.deepseek.com", "together_ai": "api.together.xyz", "fireworks_ai": "api.fireworks.ai",
    "xai": "api.x.ai",
}


def list_priced(provider: str, server: str | None) -> bool:
    """Whether LiteLLM's price list states what a call costs: at the provider's own endpoint (no
    server named, or its own host named), or for a self-hosted provider (listed at $0 or not at
    all). A model served elsewhere under a listed name (vLLM serving 'openai/gpt-4o' at --api-base)
    is not billed at that list price: its cost is unknown. The one rule for runs' usage and the
    sweep's estimates; `provider` is LiteLLM's (a model string's prefix names it)."""
    if not server or provider in SELF_HOSTED_PROVIDERS:
        return True
    return provider in PROVIDER_HOSTS and url_host(server) == PROVIDER_HOSTS[provider]


def url_host(url: str) -> str:
    """The host `url` names, in small letters ('' for none, or a URL that does not parse)."""
    from urllib.parse import urlsplit

    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


class LiteLLMBackend:
    """Any LiteLLM model string; `api_base` points it at an OpenAI-compatible server.

    `structured` is one of STRUCTURED_MODES; `limiter` (a `RateLimiter`) is shared by every thread
    that calls this backend; `sleep` waits between retries (tests pass a recorder)."""

    TRANSIENT_RETRIES = 5

    def __init__(self, model: str, api_base: str | None = None, timeout: float | None = None,
                 backoff_base: float = 1.0, *, structured: str = "auto", limiter: Any = None, max_backoff: float = 30.0,
                 retries: int | None = None, sleep: Callable[[float], None] = pause):
        import litellm

        litellm.suppress_debug_info = True  # its "Give Feedback" banner would break one-line errors
        if structured not in STRUCTURED_MODES:
            raise LMError(f"unknown structured-output mode '{structured}': use one of {', '.join(STRUCTURED_MODES)}")
        self.model = model
        self.api_base = api_base
        keep_secret(_url_credentials(api_base))  # out of every line, this backend's or not
        self.timeout = request_timeout(timeout)
        self.backoff_base = backoff_base
        self.max_backoff = max_backoff
        self.retries = self.TRANSIENT_RETRIES if retries is None else retries
        self.structured = structured
        self.limiter = limiter
        self.sleep = sleep
        # How the failure lines name the settings, fixed where the backend is made: its calls may run on
        # threads that a command's mark does not reach (DSPy's evaluation threads).
        self._setting = {option: setting_name(option) for option in ("--api-base", "--concurrency")}
        self._setting["--structured auto"] = setting_name("--structured auto", keyword="structured='auto'")
        self._table_window = model_context_window(model)
        try:
            self.provider = litellm.get_llm_provider(model, api_base=api_base)[1]
        except Exception:
            self.provider = model.split("/", 1)[0]
        self._learned = _learned_about(self.provider, api_base or model)
        self._num_ctx: int | None = None  # the window Ollama was last sent (`ollama_window`)
        try:
            params = litellm.get_supported_openai_params(model=model, custom_llm_provider=self.provider) or []
        except Exception:
            params = []
        # A seed per attempt makes a re-asked sample reproducible where the provider takes one
        # (llama.cpp and vLLM do; the embedded backend does the same).
        self.takes_seed = "seed" in params

    @property
    def name(self) -> str:
        return self.model

    @property
    def list_priced(self) -> bool:
        """Whether LiteLLM's price list states what a call costs (`list_priced`)."""
        return list_priced(self.provider, self.api_base)

    @property
    def context_window(self) -> int | None:
        """Tokens the model reads at once: what a self-hosted server states it serves the model with
        (asked once per server and model, `server_window`), else LiteLLM's figure, else None. A server
        started with a small window (llama.cpp's `-c 2048`) is then planned for before its first refusal."""
        if not self._asks_window():
            return self._table_window
        key = f"window of {self.model}"
        with _learned_lock:
            if key in self._learned:
                return self._learned[key] or self._table_window
        with _window_lock:  # one question per server and model, however many threads plan at once
            with _learned_lock:
                asked = key in self._learned
            if not asked:
                self._check_connects()  # a server that drops packets is one line, not a wait per question
                window = server_window(self.api_base, self.model.partition("/")[2] or self.model,
                                       self._server_key()[1], timeout=min(connect_timeout(), self.timeout))
                with _learned_lock:
                    self._learned[key] = window
        with _learned_lock:
            return self._learned[key] or self._table_window

    def _asks_window(self) -> bool:
        """Whether the window is asked of the server: an OpenAI-compatible one someone runs (not a
        provider's own API, and not Ollama, which is sent the window it should use: `ollama_window`)."""
        if not self.api_base or self.provider in OLLAMA_PROVIDERS:
            return False
        host = url_host(self.api_base)
        return bool(host) and host not in PROVIDER_HOSTS.values()

    @property
    def server(self) -> str | None:
        """The server as messages name it: `api_base` without user, password or query (either may hold
        a key)."""
        return public_url(self.api_base) if self.api_base else None

    @property
    def cache_identity(self) -> dict[str, Any] | None:
        """What the call cache key adds to the request (see `BooklensLM`): for Ollama, that requests
        carry `num_ctx`. An answer cached before they did may answer a prompt Ollama cut from the front,
        and is not replayed. (The value sent is left out: a window that holds the prompt changes no answer.)"""
        return {"num_ctx": "holds the prompt"} if self.provider in OLLAMA_PROVIDERS else None

    @property
    def dialect(self) -> str:
        """The structured-output dialect structured calls are sent in now."""
        if self.structured != "auto":
            return self.structured
        with _learned_lock:
            if "dialect" not in self._learned:
                self._learned["dialect"] = self._first_dialect()
            return self._learned["dialect"]

    def _first_dialect(self) -> str:
        import litellm

        if self.api_base or self.provider in SELF_HOSTED_PROVIDERS:
            return "schema"
        try:
            if litellm.supports_response_schema(model=self.model, custom_llm_provider=self.provider):
                return "schema"
            params = litellm.get_supported_openai_params(model=self.model, custom_llm_provider=self.provider) or []
        except Exception:
            return "off"
        return "json" if "response_format" in params else "off"

    @property
    def sends_cache_prompt(self) -> bool:
        if not self.api_base or self.provider not in CACHE_PROMPT_PROVIDERS:
            return False
        with _learned_lock:
            return self._learned.get("cache_prompt", True)

    @property
    def marks_cache_control(self) -> bool:
        try:
            from litellm.llms.anthropic.common_utils import supports_anthropic_cache_control

            return bool(supports_anthropic_cache_control(self.model, self.provider))
        except Exception:
            return False

    def validate(self, *, keys: bool = True) -> None:
        """Fail before any work when the model string or (with `keys`) its key cannot work."""
        import litellm

        try:
            litellm.get_llm_provider(self.model, api_base=self.api_base)
            known = bool(self.model.split("/", 1)[-1].strip())  # 'openai/' names no model
        except Exception:
            known = False
        if self.api_base and self.provider in PATH_AFTER_URL_PROVIDERS and _query_of(self.api_base):
            raise LMError(f"the server URL {public_url(self.api_base)}{_query_of(self.api_base)[0]}... has a query "
                          f"string or fragment, which '{self.model}' cannot take: LiteLLM adds the endpoint's path "
                          "after the URL, so it would land inside the query; give the server's base URL, such as "
                          "http://127.0.0.1:8000/v1")
        if self._ollama_at_v1():
            # Known from the URL alone: no Ollama API lives under /v1, and a server that answers there
            # (Ollama's own OpenAI-compatible one) would give empty answers to re-ask, or none at all.
            raise LMError(f"'{self.model}' at {self.server} would get no answer of Ollama's API: "
                          f"{self._ollama_at_v1_fix()}")
        if not known:
            if self.api_base and "/" not in self.model:
                raise LMError(f"unknown model '{self.model}': name the provider of the server at "
                              f"{public_url(self.api_base)}, e.g. openai/{self.model} for an OpenAI-compatible one")
            raise LMError(
                f"unknown model '{self.model}': use 'local' or a LiteLLM model string such as openai/gpt-4o-mini"
            ) from None
        if self.api_base or not keys:
            return  # self-hosted servers usually need no key
        try:
            env = litellm.validate_environment(model=self.model)
        except Exception:
            return
        missing = env.get("missing_keys") or []
        if missing:
            raise LMError(f"missing API key for '{self.model}': set {', '.join(missing)} in the environment")
        # LiteLLM asks whether the variable exists; an empty one (`KEY=` in a .env file) is no key either.
        variable = f"{self.provider.upper()}_API_KEY"
        if variable in os.environ and not os.environ[variable].strip():
            raise LMError(f"missing API key for '{self.model}': {variable} is set but empty")

    # -- one request -----------------------------------------------------

    def response_format(self, request: dict[str, Any], dialect: str) -> dict[str, Any] | None:
        """The `response_format` a structured request is sent with in `dialect` (None: none)."""
        if request.get("response_format") is None and request.get("schema") is None:
            return None  # free text
        schema = request.get("schema")
        if dialect == "off":
            return None
        if schema is None:  # JSON whose shape cannot be stated (open-ended mappings)
            return {"type": "json_object"}
        if dialect == "schema":
            return {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
        return {"type": "json_object", "schema": schema}

    def _kwargs(self, request: dict[str, Any], dialect: str | None) -> dict[str, Any]:
        messages = request["messages"]
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=messages,
            max_tokens=request.get("max_tokens") or DEFAULT_MAX_TOKENS,
            timeout=self.timeout,
            num_retries=0,
            max_retries=0,  # the OpenAI client would otherwise retry on its own, unseen and uncounted
        )
        with _learned_lock:
            default_temperature_only = self.model in self._learned.get("default_temperature_only", ())
        if not default_temperature_only:
            kwargs["temperature"] = request.get("temperature")
        kwargs.update(request.get("sampling") or {})  # a caller's stop, top_p, ... (`SAMPLING_SETTINGS`)
        if self.takes_seed:
            kwargs["seed"] = sample_seed(request)
        if self.api_base:
            kwargs["api_base"] = self.api_base
            # Self-hosted OpenAI-compatible servers usually take any key; the client insists on one.
            kwargs["api_key"] = self._server_key()[1] or "none"
        response_format = self.response_format(request, dialect) if dialect else None
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.provider in OLLAMA_PROVIDERS:
            kwargs["num_ctx"] = self.ollama_window(messages, kwargs["max_tokens"])  # LiteLLM puts it in `options`
        if self.sends_cache_prompt:
            kwargs["extra_body"] = {"cache_prompt": True}
        if self.marks_cache_control and len(messages) > 1:
            # The system message and the message before the last are what a step's calls share.
            kwargs["cache_control_injection_points"] = [
                {"location": "message", "role": "system"},
                {"location": "message", "index": -2},
            ]
        return kwargs

    def ollama_window(self, messages: list[dict[str, Any]], max_tokens: int) -> int:
        """The `num_ctx` an Ollama request is sent: the default --context-window (or the model's known
        window where that is smaller), doubled until the prompt and its answer budget fit. A larger
        known window (LiteLLM's table gives 32K and more for some) is not taken whole: Ollama holds
        memory for all of it, whatever the prompt. Ollama reloads the model whenever
        `num_ctx` changes, so requests that fit all get the same value, and once a request needed a
        larger one, the model's later requests keep it (a few reloads a run at most)."""
        from booklens.lm.ratelimit import count_tokens
        from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW

        needed = count_tokens(messages=messages) * OLLAMA_TOKEN_MARGIN + max_tokens
        with _learned_lock:
            window = self._num_ctx or min(int(self.context_window or DEFAULT_CONTEXT_WINDOW), DEFAULT_CONTEXT_WINDOW)
            while window < needed:
                window *= 2
            self._num_ctx = window
        return window

    def complete(self, request: dict[str, Any]) -> Completion:
        import litellm

        structured = request.get("response_format") is not None or request.get("schema") is not None
        if self.api_base:
            self._check_connects()
        failures = 0
        answer_room = None  # the answer budget a server's overflow figures leave beside the prompt
        probing = False  # whether this call is the one finding out which dialect the server takes
        try:
            while True:
                raise_if_stopped()  # a call that waited for its turn does not start after Ctrl-C
                # A call without a schema goes as `json_object` in every dialect: its answer settles nothing.
                if request.get("schema") is not None and not probing:
                    probing = self._take_dialect_turn()
                dialect = self.dialect if structured else None
                kwargs = self._kwargs(request, dialect)
                if answer_room is not None:
                    kwargs["max_tokens"] = answer_room
                if self.limiter is not None:
                    from booklens.lm.ratelimit import estimate_tokens

                    self.limiter.acquire(estimate_tokens(kwargs["messages"], kwargs["max_tokens"]))
                    raise_if_stopped()
                alone = self._one_at_a_time()
                try:
                    response = litellm.completion(**kwargs)
                except Exception as exc:
                    if alone is not None:
                        alone.release()
                    if alone is None and self.api_base and _shared_context_full(exc):
                        # llama.cpp's C++ server: its slots share one context, and the requests in flight
                        # together filled it (each of them fails). From now on, one request at a time.
                        with _learned_lock:
                            self._learned.setdefault("one_at_a_time", threading.Lock())
                        continue
                    room = None if answer_room is not None else _answer_room(exc, kwargs["max_tokens"])
                    if room is not None:
                        answer_room = room  # once: the same prompt with the budget the server leaves it
                        continue
                    failures = self._after_failure(exc, kwargs, dialect, failures)
                    raise_if_stopped()  # after Ctrl-C, a call that failed in flight is not sent again
                    continue
                except BaseException:
                    if alone is not None:
                        alone.release()
                    raise
                if alone is not None:
                    alone.release()
                if not getattr(response, "choices", None):
                    failures = self._without_choices(failures)
                    raise_if_stopped()
                    continue
                with _learned_lock:
                    self._learned["answered"] = True
                    if probing and self._learned.get("dialect") == dialect:
                        self._learned["dialect_settled"] = True  # the schema went in this dialect, and was taken
                completion = self._completion(response, kwargs["messages"])
                # what the window left: a larger budget cannot help an answer it cut off
                completion.answer_room = (answer_room if answer_room is not None
                                          else _window_cut(response, kwargs["max_tokens"]))
                return completion
        finally:
            if probing:
                with _dialect_settled:
                    self._learned.pop("dialect_probe", None)
                    _dialect_settled.notify_all()

    def _one_at_a_time(self) -> threading.Lock | None:
        """The held lock that keeps this server to one request at a time, once it was found to need
        that (llama.cpp's C++ server whose slots share one context that the requests in flight filled),
        else None. A call waiting for its turn stops as soon as its work is asked to stop."""
        with _learned_lock:
            lock = self._learned.get("one_at_a_time")
        if lock is None:
            return None
        while not lock.acquire(timeout=STOP_CHECK_INTERVAL):
            raise_if_stopped()
        return lock

    def _take_dialect_turn(self) -> bool:
        """Wait while another call finds out which structured-output dialect this server takes (the
        first structured request goes alone: calls in flight at once would each be refused in the
        dialect it refuses). Only calls with a schema take part: one without goes as `json_object` in
        every dialect, so its answer settles nothing. True when this call is to find out; False once the dialect is known, or
        when none needs finding out (a forced --structured, or `off`, which nothing can refuse). A
        call that ends without an answer (a fault, Ctrl-C) hands the turn to one of the waiting ones;
        a waiting call stops as soon as its work is asked to stop."""
        if self.structured != "auto" or self.dialect == DIALECTS[-1]:
            return False
        while True:
            with _dialect_settled:
                if self._learned.get("dialect_settled") or self._learned.get("dialect") == DIALECTS[-1]:
                    return False
                if not self._learned.get("dialect_probe"):
                    self._learned["dialect_probe"] = True
                    return True
                _dialect_settled.wait(STOP_CHECK_INTERVAL)
            raise_if_stopped()

    def _check_connects(self) -> None:
        """Before the first request to the `api_base` server (once per server and process): a TCP
        connection to it opens within `connect_timeout()`, or a one-line `LMError`, not a request
        timeout per try. A refused connection or an unknown host is left to the request, which names
        it; behind a proxy (HTTP(S)_PROXY) nothing is checked: the proxy makes the connection."""
        import socket

        with _learned_lock:
            if self._learned.get("connects"):
                return
        target = connect_target(self.api_base)
        if target is None:
            return
        host, port = target
        wait = min(connect_timeout(), self.timeout)
        try:
            socket.create_connection((host, port), timeout=wait).close()
        except TimeoutError:  # socket.timeout is TimeoutError from Python 3.10 on
            shown = f"[{host}]" if ":" in host else host
            raise LMError(f"'{self.model}' at {self.server} does not answer: no connection to {shown}:{port} within "
                          f"{wait:g} s (is the server up, and its port open to this machine? BOOKLENS_CONNECT_TIMEOUT "
                          "sets how long)") from None
        except OSError:
            return
        with _learned_lock:
            self._learned["connects"] = True

    def _without_choices(self, failures: int) -> int:
        """A response with no completion in it (a proxy that lost its upstream's answer): from a server
        that has answered, a glitch, retried with backoff; from one that never has, one line at once."""
        where = f"'{self.model}'" + (f" at {self.server}" if self.api_base else "")
        with _learned_lock:
            answered = self._learned.get("answered", False)
        if not answered:
            raise LMError(f"{where} answered without a completion (no choices in its response)")
        failures += 1
        if failures > self.retries:
            raise LMError(f"{where} kept answering without a completion (no choices in its response) after "
                          f"{failures} tries")
        self.sleep(self._backoff(failures))
        return failures

    def _backoff(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th transient failure in a row: doubling from
        `backoff_base`, at most `max_backoff`, plus up to 25% jitter."""
        return min(self.max_backoff, self.backoff_base * 2 ** (failures - 1)) * (1 + random.random() * 0.25)

    def _completion(self, response: Any, messages: list[dict[str, Any]] | None = None) -> Completion:
        import litellm

        from booklens.lm.ratelimit import count_tokens

        if not getattr(response, "choices", None):
            where = f"'{self.model}'" + (f" at {self.server}" if self.api_base else "")
            raise LMError(f"{where} answered without a completion (no choices in its response)")
        choice = response.choices[0]
        text = _without_opened_reasoning(choice.message.content or "")
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        # A server that sends no usage (some proxies and small servers) leaves LiteLLM's counts at 0,
        # which no real call has: its tokens are counted here as the rate limiter counts them, and its
        # cost is unknown (what the server would bill is not known).
        counted = prompt_tokens > 0 and (completion_tokens > 0 or not text)
        cost = None
        if counted and self.list_priced:
            try:
                cost = float(litellm.completion_cost(completion_response=response))
            except Exception:
                cost = None  # a model LiteLLM has no prices for
        else:
            if not prompt_tokens and messages:
                prompt_tokens = count_tokens(messages=messages)
            if not completion_tokens and text:
                completion_tokens = count_tokens(text=text)
        return Completion(
            text=text,
            finish_reason=choice.finish_reason or "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=cost,
            provider_cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
            reasoning_only_tokens=_reasoning_only_tokens(choice.message, text, usage),
        )

    # -- faults ----------------------------------------------------------

    def _after_failure(self, exc: Exception, kwargs: dict[str, Any], dialect: str | None, failures: int) -> int:
        """Decide what a failed request means: return the transient-failure count to try again
        (after waiting), or raise LMError with one line."""
        import litellm
        import openai

        if not isinstance(exc, openai.OpenAIError):
            raise exc  # not a provider's answer: a bug, shown as such
        in_body = _error_in_body(exc)
        text = _said(exc)
        status = getattr(exc, "status_code", None)
        where = f"'{self.model}'" + (f" at {self.server}" if self.api_base else "")

        if ((isinstance(exc, litellm.ContextWindowExceededError) or _mentions_context_limit(text))
                and not _shared_context_full(exc)):
            raise ContextWindowExceeded(self._redact(context_window_message(self.model, text)),
                                        window=context_window_of(text)) from None
        if isinstance(exc, (litellm.AuthenticationError, litellm.PermissionDeniedError)) or status in (401, 403):
            # (LiteLLM turns some providers' 403 into a plain APIError.)
            raise LMError(f"authentication failed for {where}: {self._key_advice()}") from None
        if any(type(cause) is openai.OpenAIError for cause in _causes(exc)):
            # The client's own refusal before sending anything (no key at all, say), which LiteLLM
            # reports as a server's 500: no retry can change it.
            raise LMError(self._redact(f"cannot send a request to {where}: {server_text(exc)}")) from None
        if _unsendable_header(exc):
            # No request left: the client could not write the key into the Authorization header
            # (LiteLLM reports it as a server's 500 or a connection error, and may quote the header).
            raise LMError(f"cannot send a request to {where}: its API key holds a character that no HTTP header "
                          "can carry (a quote that is not ASCII, a line break, a space at its end): check the key in "
                          "the environment") from None
        if status == 429 and _quota_used_up(exc):
            # OpenAI's answer to a key without credit: a 429 that no wait mends.
            raise LMError(self._redact(f"{where} refused the request: the quota of its API key is used up "
                                       f"({server_text(exc)}): check the plan and billing of the key")) from None
        if kwargs.get("temperature") is not None and status == 400 and _refuses_temperature(text):
            # OpenAI's reasoning models take no temperature but their default (LiteLLM refuses the others
            # before sending): learned per model, since other models at one server may take any.
            with _learned_lock:
                self._learned.setdefault("default_temperature_only", set()).add(self.model)
            log.info("%s takes only its default temperature; sending none from now on", self.model)
            return failures
        if "response_format" in kwargs and status != 429 and _mentions_response_format(text):
            if self.structured != "auto":
                raise LMError(self._redact(
                    f"{where} refused the '{dialect}' structured-output format ({_status(exc)}{server_text(exc)}); "
                    f"try {self._setting['--structured auto']}")) from None
            self._refused(dialect)
            return failures
        if "extra_body" in kwargs and "cache_prompt" in text:
            with _learned_lock:
                self._learned["cache_prompt"] = False
            return failures
        if isinstance(exc, litellm.NotFoundError) or status == 404:
            raise LMError(self._redact(self._not_found(exc))) from None
        if _NULL_CHOICES in text:
            # `"choices": null`, which LiteLLM refuses to read: a response without choices, as an empty list is.
            return self._without_choices(failures)
        with _learned_lock:
            answered = self._learned.get("answered", False)
        if _unreachable(exc) and not answered:
            # Nothing listens there (or the name does not resolve): backoff would not change that.
            raise LMError(f"cannot connect to {self.server or self.model}: {_unreachable(exc)} "
                          f"(is the server running, and is {self._setting['--api-base']} right?)") from None
        if self.api_base and not answered and in_body is None and _not_a_completion(exc):
            # An HTTP 200 whose body is no chat completion (a web page, a health check), from a
            # server that never answered one: another service lives at that URL; asking again
            # would only repeat it. (After an answer, it is taken for a glitch and retried.)
            what = "an answer of Ollama's API" if self.provider in OLLAMA_PROVIDERS else "an OpenAI-compatible chat completion"
            raise LMError(self._redact(f"{self.server} answered, but not with {what} ({server_text(exc, 160)}): "
                                       f"{self._check_api_base()}")) from None
        if self.api_base and status in _NO_POST:
            # A web server that is no API (a static site, a dashboard, Python's http.server, which
            # implements no POST at all) takes no POST at that path.
            raise LMError(f"{self.server} takes no requests at the path '{self.model}' was sent to ({status} "
                          f"{_NO_POST[status]}): {self._check_api_base()}") from None
        if self._ollama_at_v1() and not answered and _unreadable_answer(exc):
            # Ollama's routes post to /api/chat (or /api/generate) under the URL: under /v1 no Ollama API
            # answers, and an OpenAI-compatible server's answer there LiteLLM cannot read as Ollama's (it
            # reports that as a dropped connection, which was retried). Asking again would only repeat it.
            raise LMError(f"{where} got no answer of Ollama's API: {self._ollama_at_v1_fix()}") from None
        fix = _unservable_fix(text, self.model.split("/", 1)[-1])
        if fix:
            raise LMError(self._redact(f"{where} cannot serve the model ({server_text(exc)}): {fix}")) from None
        transient = isinstance(exc, (litellm.RateLimitError, litellm.Timeout, litellm.APIConnectionError,
                                     litellm.InternalServerError, litellm.ServiceUnavailableError,
                                     litellm.BadGatewayError)) or status in TRANSIENT_STATUS or _unreachable(exc)
        # A body that is no chat completion, from a server that has answered (a proxy's glitch, JSON cut
        # off in transit): some routes (hosted_vllm/) report it with the 200 it came with.
        transient = transient or (in_body is None and _not_a_completion(exc))
        if not transient:
            if in_body is not None:
                # An error object where the chat completion should be (in an HTTP 200): the server's words
                # are the whole story; that it was sent with 200 says nothing about the request.
                raise LMError(self._redact(f"{where} answered with an error instead of a chat completion" + (
                    f": {server_text(exc)}" if in_body else " (its words are in the server's log)"))) from None
            if isinstance(exc, litellm.BadRequestError):
                raise LMError(self._redact(f"{where} rejected the request: {server_text(exc)}")) from None
            raise LMError(self._redact(f"{where} failed: {type(exc).__name__}: {server_text(exc)}")) from None
        failures += 1
        if failures > self.retries:
            if _unreachable(exc):
                # A server that answered before and now refuses every connection has stopped (LiteLLM
                # calls that an InternalServerError, "Connection error.").
                raise LMError(self._redact(f"{where} kept failing after {failures} tries: {_unreachable(exc)} (has "
                                           "the server stopped? the completed calls are cached: rerun once it is "
                                           "back)")) from None
            if isinstance(exc, litellm.Timeout):
                # (LiteLLM's words say it twice: "Request timed out. Error_str: Request timed out.") A server
                # works on as many requests at once as it has slots and queues the rest, and the wait counts.
                raise LMError(f"{where} kept failing after {failures} tries: no answer within {self.timeout:g} s "
                              "(BOOKLENS_TIMEOUT sets how long; the time a request waits in the queue of a server "
                              f"with fewer parallel slots than {self._setting['--concurrency']} counts)") from None
            said = server_text(exc)
            # llama.cpp's server answers 503 "Loading model" until its weights are in memory, which a
            # large model on a slow disk may take longer than the retries wait.
            loading = (" (the server is still loading its model: rerun once it has; the completed calls are cached)"
                       if re.search(r"\bloading model\b", said, re.IGNORECASE) else "")
            if _shared_context_full(exc):
                loading = (" (the server's slots share one context, which other requests kept full: start it with "
                           "--parallel N, each slot then with its own window, or send it one command at a time)")
            raise LMError(self._redact(
                f"{where} kept failing after {failures} tries: {type(exc).__name__}: {said}{loading}"
            )) from None
        wait = retry_after(exc)
        if wait is None:
            wait = self._backoff(failures)
        elif wait > MAX_RETRY_AFTER:
            raise LMError(f"{where} asks to wait {wait:.0f} s before the next request (Retry-After); "
                          "rerun later to resume from the cache") from None
        self.sleep(wait)
        return failures

    def _server_key(self) -> tuple[str, str | None]:
        """(variable, key) of the key sent to an `api_base` server: BOOKLENS_API_KEY, else the provider's
        own variable (OPENAI_API_KEY, HOSTED_VLLM_API_KEY, ...); the key is None when neither is set."""
        provider_variable = f"{self.model.split('/', 1)[0].upper()}_API_KEY"
        for variable in ("BOOKLENS_API_KEY", provider_variable):
            if os.environ.get(variable):
                return variable, os.environ[variable]
        return provider_variable, None

    def _key_advice(self) -> str:
        """What to do when the server refused the key (401, 403)."""
        if not self.api_base:
            return "check its API key in the environment"
        variable, key = self._server_key()
        if key is None:
            # A placeholder went (the client insists on a key): the server wants a real one.
            return f"no API key was sent: set BOOKLENS_API_KEY (or {variable}) in the environment"
        return f"check the API key in {variable}"

    def _check_api_base(self) -> str:
        """The advice for a URL where no API of the model's provider answers."""
        if self.provider in OLLAMA_PROVIDERS:
            return f"check {self._setting['--api-base']}, usually the Ollama server's root, such as {OLLAMA_ROOT}"
        return f"check {self._setting['--api-base']}, usually the server's URL ending in /v1"

    def _ollama_at_v1(self) -> bool:
        """Whether an Ollama route (ollama_chat/, ollama/) was given a URL ending in /v1, where an
        OpenAI-compatible API lives (Ollama's own included), not Ollama's own API."""
        from urllib.parse import urlsplit

        return (self.provider in OLLAMA_PROVIDERS and bool(self.api_base)
                and urlsplit(self.api_base).path.rstrip("/").endswith("/v1"))

    def _ollama_at_v1_fix(self) -> str:
        """What to do when an Ollama route was given a URL ending in /v1 (see `_ollama_at_v1`)."""
        name = self.model.split("/", 1)[-1]
        return (f"{self.provider}/ speaks Ollama's own API, which is at the server's root: give "
                f"{self._setting['--api-base']} without /v1, such as {OLLAMA_ROOT}, or use openai/{name} for an "
                "OpenAI-compatible server (Ollama's /v1 is one)")

    def _not_found(self, exc: BaseException) -> str:
        """The line for a 404: the model, or the path the request went to, is not at the server."""
        from urllib.parse import urlsplit

        if not self.api_base:
            return f"model '{self.model}' was not found by its provider ({server_text(exc)})"
        path = urlsplit(self.api_base).path.rstrip("/")
        where = f"model '{self.model}' was not found at {self.server}"
        if self._ollama_at_v1():
            return f"{where}: {self._ollama_at_v1_fix()}"
        if self.provider in OLLAMA_PROVIDERS:
            # Ollama's own API lives at the root: its 404 there is a model it has not pulled.
            pulled = self.model.split("/", 1)[-1]
            return (f"{where} ({server_text(exc)}): check the model name (`ollama list` shows the ones the server "
                    f"has; `ollama pull {pulled}` fetches it) and that {self._setting['--api-base']} is the Ollama "
                    f"server's root, such as {OLLAMA_ROOT}")
        if path.endswith("/v1"):
            # The path is the usual one, so the server most likely serves no model of that name.
            return (f"{where} ({server_text(exc)}): check the model name; the server lists the ones it "
                    f"serves at {self.server.rstrip('/')}/models")
        return f"{where} (check {self._setting['--api-base']}: OpenAI-compatible servers usually end in /v1)"

    def _refused(self, dialect: str | None) -> None:
        with _learned_lock:
            if self._learned.get("dialect") == dialect and dialect != DIALECTS[-1]:
                self._learned["dialect"] = DIALECTS[DIALECTS.index(dialect) + 1]
                log.info("%s refused the '%s' structured-output format; using '%s' from now on",
                         self.server or self.model, dialect, self._learned["dialect"])

    def _redact(self, text: str) -> str:
        """Keys and the server URL's password never reach a message, even when a server echoes what
        it was sent (the URL it was asked at, say)."""
        return redacted(text)  # the URL's own credentials were kept when the backend was made


def _url_credentials(url: str | None) -> set[str]:
    """What a server may echo of the user and password in `url`: 'user:password' as written and
    decoded, its HTTP Basic token (the client sends one for such a URL), and the password alone (a
    user alone, when there is no password: then it is the key), unless so short that taking it out
    would garble the message."""
    import base64
    from urllib.parse import unquote, urlsplit

    if not url:
        return set()
    try:
        parts = urlsplit(url)
        user, password = parts.username or "", parts.password
    except ValueError:
        return set()
    if not password:
        return {user} if len(user) >= 8 else set()
    found = set()
    for name, word in {(user, password), (unquote(user), unquote(password))}:
        pair = f"{name}:{word}"
        found |= {pair, base64.b64encode(pair.encode()).decode()} | ({word} if len(word) >= 4 else set())
    return found


# ---------------------------------------------------------------------------
# Reading errors


def server_text(exc: BaseException, limit: int = 300) -> str:
    """What the server (or LiteLLM) said, on one line, without the exception class names LiteLLM puts
    before it ('litellm.BadRequestError: OpenAIException - ...') or the error body around it."""
    lines = redacted(_server_words(_said(exc))).splitlines()  # before the cut: a key cut in two would stay
    return lines[0][:limit] if lines else type(exc).__name__


# The statuses of a web server that takes no POST where the request went, with their reasons.
_NO_POST = {405: "Method Not Allowed", 501: "Not Implemented"}

# LiteLLM's words for a response whose `choices` is no list (`null`), on every route.
_NULL_CHOICES = "returned 'choices' that is not a list"

# LiteLLM's words for an error object in a 200 whose message it does not read (a string, say).
_UNREAD_ERROR = "Error in response object"


def _error_in_body(exc: BaseException) -> str | None:
    """The server's message when it sent an error object in place of a chat completion (with an HTTP
    200), '' when LiteLLM read none from it; None for any other failure. LiteLLM raises such an object
    as a bare Exception that carries the message as an attribute, which its OpenAI route then drops."""
    for cause in _causes(exc):
        message = getattr(cause, "message", None)
        if type(cause) is Exception and isinstance(message, str):
            return "" if message.strip() == _UNREAD_ERROR else message.strip()
    return None


def _said(exc: BaseException) -> str:
    """`str(exc)`, with the message of an error object sent in place of a completion where it lacks it."""
    text, in_body = str(exc), _error_in_body(exc)
    return f"{text.rstrip()} {in_body}" if in_body and in_body not in text else text


def _server_words(text: str) -> str:
    """`text` without LiteLLM's class names, and the message alone when what is left is an error body:
    the OpenAI SDK's 'Error code: 400 - {'error': '...'}' (a dict as Python prints it) for a body it
    cannot read as OpenAI's, or the JSON body LiteLLM's own routes (hosted_vllm/, ...) pass on. LM
    Studio and TGI send `{"error": "..."}`, llama.cpp and vLLM `{"error": {"message": ...}}`."""
    import ast
    import json

    text = _LITELLM_ADVICE.sub("", _RESPONSE_REPRS.sub("", _without_class_names(text)))
    text = _DROP_PARAMS_ADVICE.sub("", text)
    body = _ERROR_CODE.sub("", text, count=1).strip()
    if not body.startswith("{"):
        return text
    try:
        parsed = json.loads(body)
    except ValueError:
        try:
            parsed = ast.literal_eval(body)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text
    for _ in range(3):  # {"error": {"message": ...}}, {"detail": ...}, a message that is itself such a body
        if not isinstance(parsed, dict):
            break
        parsed = next((parsed[k] for k in ("error", "message", "detail") if parsed.get(k)), None)
    return parsed.strip() if isinstance(parsed, str) and parsed.strip() else text


# What LiteLLM's openai/ route adds after the parser's words for a body that is not JSON: reprs of the
# client's objects ("Received response - <APIResponse [200 OK] type=<class ...>>, Type of response - ...").
_RESPONSE_REPRS = re.compile(r",?\s*Received response - <APIResponse\b.*?(?:, Type of response - <class '[^']*'>|$)",
                             re.DOTALL)

# LiteLLM's advice to programmers at the end of some routes' errors ("... Handle with `litellm.InternalServerError`.").
_LITELLM_ADVICE = re.compile(r"\.?\s*Handle with `litellm\.\w+`\.?\s*$")

# LiteLLM's advice after naming a setting a provider does not take ("... for model=x. To drop these, set
# `litellm.drop_params=True` or for proxy: ...", over several lines): no booklens option reaches it.
_DROP_PARAMS_ADVICE = re.compile(r"\.?\s*To drop [^\n]*?, set `(?:litellm\.)?drop_params=True`.*\Z", re.DOTALL)

# The OpenAI SDK's start of a message whose body it could not read as OpenAI's error object.
_ERROR_CODE = re.compile(r"^Error code: \d+ - ")


def _without_class_names(text: str) -> str:
    text, previous = text.strip(), None
    while text != previous:
        previous, text = text, _LITELLM_PREFIX.sub("", text, count=1).strip()
    return text


# 'litellm.BadRequestError: ', 'InternalServerError: ', 'OpenAIException - ', 'Hosted_vllmException - ', ...
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.)?[A-Za-z_]*(?:Error|Exception|Timeout)(?::| -)\s+")


def server_window(server: str, model_id: str, key: str | None, *, timeout: float) -> int | None:
    """The context window (prompt and answer) an OpenAI-compatible server says it serves `model_id`
    with: `max_model_len` in its model list (vLLM, SGLang), else the per-slot `n_ctx` of llama.cpp's
    `/props`, else `max_total_tokens` in Text Generation Inference's `/info`, else the loaded
    instance's `context_length` in LM Studio's `/api/v1/models` (`lm_studio_window`); None when it says
    none of them (llama-cpp-python's server, an error, no answer in `timeout` seconds: then no other
    route is asked). Only a whole number above 0 counts."""
    import json
    import socket
    import urllib.error
    import urllib.request

    base = server.rstrip("/")
    silent = []  # a route that timed out: the server holds requests unanswered, so no route is asked after it

    def fetched(url: str) -> Any:
        if silent:
            return None
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read(WINDOW_ANSWER_LIMIT))
        except Exception as exc:  # no such route, a refusal, a body that is not JSON: the server does not say
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, (TimeoutError, socket.timeout)):
                silent.append(url)
            return None

    listed = fetched(f"{base}/models")
    entries = listed.get("data") if isinstance(listed, dict) else None
    if isinstance(entries, list):
        entries = [entry for entry in entries if isinstance(entry, dict)]
        # The model asked for, or the one a single-model server serves under whatever name.
        named = [entry for entry in entries if entry.get("id") == model_id] or (entries if len(entries) == 1 else [])
        for entry in named:
            if _stated_window(entry.get("max_model_len")):
                return entry["max_model_len"]
    root = base.removesuffix("/v1")  # llama.cpp and TGI serve these beside /v1, not in it
    props = fetched(f"{root}/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if isinstance(settings, dict) and _stated_window(settings.get("n_ctx")):
        return settings["n_ctx"]
    info = fetched(f"{root}/info")
    if isinstance(info, dict) and _stated_window(info.get("max_total_tokens")):
        return info["max_total_tokens"]
    return lm_studio_window(fetched(f"{root}/api/v1/models"), model_id)


def lm_studio_window(listed: Any, model_id: str) -> int | None:
    """The window LM Studio's native model list (`GET /api/v1/models`) gives the loaded instances of
    `model_id` (named by the model's key or an instance's id): the smallest, as a request may reach
    any of them. Not the model's `max_context_length`: LM Studio loads a model with its own default
    (often 4096), and loads one on demand with a window it does not state, so then None."""
    models = listed.get("models") if isinstance(listed, dict) else None
    windows = []
    for model in models if isinstance(models, list) else []:
        instances = model.get("loaded_instances") if isinstance(model, dict) else None
        if not isinstance(instances, list):
            continue
        instances = [instance for instance in instances if isinstance(instance, dict)]
        if model.get("key") != model_id:
            instances = [instance for instance in instances if instance.get("id") == model_id]
        for instance in instances:
            config = instance.get("config")
            length = _stated_window(config.get("context_length")) if isinstance(config, dict) else None
            if length:
                windows.append(length)
    return min(windows, default=None)


def _stated_window(value: Any) -> int | None:
    """A window a server states: only a whole number above 0 counts (not a bool, a float or a string)."""
    return value if type(value) is int and value > 0 else None


def _learned_about(provider: str, server: str) -> dict[str, Any]:
    with _learned_lock:
        return _learned.setdefault((provider, server), {})


def forget_learned() -> None:
    """Forget what the backends learned of every server (`booklens.lm.model.forget_servers`)."""
    with _learned_lock:
        _learned.clear()


def _reasoning_only_tokens(message: Any, text: str, usage: Any) -> int:
    """The reasoning tokens of an answer that holds nothing but reasoning (a server that splits the
    thinking off sends it as `reasoning_content`, with empty content), else 0. The reasoning itself
    is never part of the answer."""
    reasoning = getattr(message, "reasoning_content", None)
    if text.strip() or not isinstance(reasoning, str) or not reasoning.strip():
        return 0
    from booklens.lm.ratelimit import count_tokens

    details = getattr(usage, "completion_tokens_details", None)
    for reported in (getattr(details, "reasoning_tokens", None), getattr(usage, "completion_tokens", None)):
        if isinstance(reported, int) and reported > 0:
            return reported
    return count_tokens(text=reasoning)


def _without_opened_reasoning(text: str) -> str:
    """`text` without the reasoning before a `</think>` that has no `<think>` before it: the chat
    templates of DeepSeek-R1's distills and QwQ end the prompt with `<think>`, so a server that does
    not split the reasoning off (vLLM without --reasoning-parser) sends 'reasoning</think>answer'.
    (LiteLLM already drops a block that opens in the answer.) The reasoning is no part of the answer:
    kept, it began every summary."""
    reasoning, tag, answer = text.partition("</think>")
    return answer.lstrip() if tag and "<think>" not in reasoning else text


def _status(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"{status}: " if status else ""


def _mentions_response_format(text: str) -> bool:
    return "response_format" in text or "json_schema" in text


def _quota_used_up(exc: BaseException) -> bool:
    """Whether a 429 says the key's quota is used up (OpenAI's code 'insufficient_quota', in the error
    body or, on routes that pass the body on as text, in the message), not that requests came too fast.
    (Gemini words its per-minute limits 'You exceeded your current quota' too: only the code tells.)"""
    body = getattr(exc, "body", None)
    codes = (body.get("code"), body.get("type")) if isinstance(body, dict) else ()
    return "insufficient_quota" in codes or "insufficient_quota" in str(exc)


def _refuses_temperature(text: str) -> bool:
    """Whether a 400 says the model does not take the temperature it was sent ('O-series models don't
    support temperature=0.0', OpenAI's "Unsupported value: 'temperature' does not support 0.0")."""
    lowered = text.lower()
    return "temperature" in lowered and "support" in lowered


# What servers say when a prompt does not fit their context window, in lower case: the one list that
# makes an error a context overflow (the patterns further down read the figures some give).
CONTEXT_OVERFLOW_WORDS = (
    "maximum context length", "context_length_exceeded",  # OpenAI, vLLM, llama-cpp-python's server
    "context window",  # LiteLLM's own words, llama-cpp-python in this process
    "exceeds the available context size", "exceed_context_size",  # llama.cpp's server; Ollama not truncating
    "cannot truncate prompt with n_keep",  # llama.cpp's server before it gave the figures
    "maximum model length", "too long to fit into the model",  # older vLLM
    "when context the overflows", "when context overflows",  # LM Studio 0.3 (with its spelling)
    "tokens to keep from the initial prompt is greater than the context length",  # LM Studio 0.3.2x, 0.4
    "context size has been exceeded",  # LM Studio's MLX engine
    "`max_new_tokens` must be <=", "`inputs` must have less than",  # Text Generation Inference
    "longer than the context length", "exceeds the context length",  # Ollama told not to truncate
)


# What Ollama's runner says, in lower case, when it ran out of memory (after "process has terminated:").
_RUNNER_OUT_OF_MEMORY = (r"out of memory|out of device memory|cudamalloc failed|hipmalloc failed|unable to allocate"
                         r"|failed to allocate|allocation failed|not enough memory|insufficient memory")
_SMALLER_MODEL = "use a smaller model (or a smaller quantization of it)"

# What servers say when the model cannot be served at all, as patterns searched for in the lower-cased
# text, with the fix ({name}: the model's name at the server): the one list of failures that no retry
# mends, whatever their status (Ollama sends them with a 500, which is otherwise a passing fault).
# Ollama's words for a model it could not load for lack of memory differ by version. Memory that runs
# out while a loaded model answers is not here: newer Ollama then unloads its other models, and the
# next try may pass.
UNSERVABLE_MODEL_WORDS = (
    (r"model requires more system memory", _SMALLER_MODEL),  # Ollama up to 0.24, before it loads
    (r"failed to allocate memory for model|memory layout cannot be allocated", _SMALLER_MODEL),  # Ollama 0.12-0.24
    (r"llama-server reported out-of-memory", _SMALLER_MODEL),  # Ollama 0.30 on, while loading
    # The runner that loads the model ended, with its last error: "llama runner process has terminated:
    # cudaMalloc failed: out of memory", "... error loading model: unable to allocate CUDA0 buffer"
    # ("llama-server process has terminated: ..." from Ollama 0.30 on).
    (rf"(?:llama runner|llama-server) process has terminated:.*(?:{_RUNNER_OUT_OF_MEMORY})", _SMALLER_MODEL),
    (r"not found, try pulling it first", "run `ollama pull {name}` where the server runs"),  # Ollama
)


def _unservable_fix(text: str, name: str) -> str | None:
    """The fix for a model the server says it cannot serve (see UNSERVABLE_MODEL_WORDS), else None."""
    lowered = text.lower()
    return next((fix.format(name=name) for words, fix in UNSERVABLE_MODEL_WORDS
                 if re.search(words, lowered, re.DOTALL)), None)


def _shared_context_full(exc: BaseException) -> bool:
    """Whether a failure is llama.cpp's C++ server saying that the context its slots share is full:
    a 500 'Context size has been exceeded.' from decoding, sent to every request in flight, though
    each prompt alone fits its window (one too large alone gets a 400 with its figures before any
    decoding). Not the prompt's size, so retried: the other requests (another command's too) end.
    LM Studio's MLX engine says the same words of a prompt too large, with a 400."""
    import litellm

    return (getattr(exc, "status_code", None) == 500 and not isinstance(exc, litellm.ContextWindowExceededError)
            and "context size has been exceeded" in _said(exc).lower())


def _mentions_context_limit(text: str) -> bool:
    lowered = text.lower()
    return any(words in lowered for words in CONTEXT_OVERFLOW_WORDS)


def _causes(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _unsendable_header(exc: BaseException) -> bool:
    """Whether the HTTP client refused to write a header of the request (the key, in Authorization): a
    character that is not ASCII, or one HTTP does not allow there (a line break, a space at an end)."""
    import httpx

    return any(isinstance(cause, UnicodeEncodeError)
               or (isinstance(cause, httpx.LocalProtocolError) and "header" in str(cause).lower())
               for cause in _causes(exc))


def _not_a_completion(exc: BaseException) -> bool:
    """Whether LiteLLM gave up on an HTTP 200 whose body is no chat completion (not JSON, no list of
    choices): a JSON decoding error among its causes, or on the OpenAI route a 500 without response
    headers, which a server's own 500 has, from no failed connection (a dropped one is a 500 without
    headers too)."""
    import json

    import litellm

    if any(isinstance(cause, json.JSONDecodeError) for cause in _causes(exc)):
        # A body that is not JSON at all (a proxy's login page): LiteLLM's own routes (hosted_vllm/,
        # ollama_chat/, ...) report it as an API or even a connection error.
        return True
    if not (isinstance(exc, litellm.InternalServerError) and getattr(exc, "status_code", None) == 500
            and not getattr(exc, "litellm_response_headers", None)):
        return False
    return not _failed_connection(_causes(exc)) and "Connection error" not in str(exc)


def _unreadable_answer(exc: BaseException) -> bool:
    """Whether LiteLLM failed on reading what the server sent back (a TypeError, KeyError or
    AttributeError among the causes: its route read a body of another API's shape), with no failed
    connection under it. LiteLLM reports that as a connection error of its own."""
    causes = list(_causes(exc))[1:]
    return (any(isinstance(cause, (TypeError, KeyError, AttributeError)) for cause in causes)
            and not _failed_connection(causes))


def _failed_connection(causes: Iterable[BaseException]) -> bool:
    """Whether a failed connection is among `causes` (the chain `_causes` walks): what a dropped or
    refused connection raises through the OpenAI client, httpx or the socket."""
    import httpx
    import openai

    return any(isinstance(cause, (openai.APIConnectionError, httpx.TransportError, OSError)) for cause in causes)


def _unreachable(exc: BaseException) -> str | None:
    """'connection refused' or 'name not resolved' when nothing could be reached, else None."""
    import socket

    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not resolved"
    return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds a provider asked to wait (`retry-after-ms` or `Retry-After`, seconds or a date)."""
    headers = getattr(exc, "litellm_response_headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        if "retry-after" in lowered:
            value = lowered["retry-after"].strip()
            try:
                return max(0.0, float(value))
            except ValueError:
                from email.utils import parsedate_to_datetime

                return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
    return None


# The figures each phrasing of CONTEXT_OVERFLOW_WORDS gives (window N, prompt P, answer budget C).
# OpenAI, vLLM and llama-cpp-python's server: "This model's maximum context length is N tokens.
# However, you requested M tokens (P in the messages, C in the completion)."; newer vLLM: "'max_tokens' or
# 'max_completion_tokens' is too large: C. This model's maximum context length is N tokens and your
# request has P input tokens (C > N - P)."; older vLLM: "The decoder prompt (length P) is longer than the
# maximum model length of N." and "The prompt (total length P) is too long to fit into the model (context
# length N)."; llama.cpp's C++ server: "request (P tokens) exceeds the available context size (N tokens),
# try increasing it", before that "Cannot truncate prompt with n_keep (P) >= n_ctx (N)"; LM Studio:
# "Trying to keep the first P tokens when context the overflows. However, the model is loaded with context
# length of only N tokens, ..." and "The number of tokens to keep from the initial prompt is greater than
# the context length (n_keep: P>= n_ctx: N)."; TGI: "`inputs` tokens + `max_new_tokens` must be <= N. Given:
# P `inputs` tokens and C `max_new_tokens`" and "`inputs` must have less than N tokens. Given: P";
# llama-cpp-python in this process (the embedded model): "Requested tokens (P) exceed context window of N".
_CONTEXT = re.compile(r"maximum context length is (\d+)|available context size \((\d+) tokens\)"
                      r"|exceed context window of (\d+)|maximum model length of (\d+)|\(context length (\d+)\)"
                      r"|context length of only (\d+)|n_ctx(?::\s*| \()(\d+)|must be <= (\d+)"
                      r"|must have less than (\d+) tokens")
_REQUESTED = re.compile(r"(\d+) in the messages, (\d+) in the completion")
_TOO_LARGE = re.compile(r"is too large: (\d+)|and (\d+) `max_new_tokens`")
_PROMPT = re.compile(r"messages resulted in (\d+) tokens|prompt (?:is|has) (\d+) tokens"
                     r"|your request has (\d+) input tokens|request \((\d+) tokens\) exceeds"
                     r"|Requested tokens \((\d+)\) exceed|prompt \((?:total )?length (\d+)\)"
                     r"|keep the first (\d+) tokens|n_keep(?::\s*| \()(\d+)|Given: (\d+)")


def _number(match: re.Match | None) -> int | None:
    return next((int(g) for g in match.groups() if g is not None), None) if match else None


# The least answer budget a request is sent again with when a server refuses its budget beside a
# prompt that fits: below it, an answer would be cut off before it says anything.
MIN_ANSWER_ROOM = 16


def _window_cut(response: Any, max_tokens: int | None) -> int | None:
    """The tokens an answer got when the context window, not its budget, ended it, else None. llama.cpp's
    servers state no window and write only as far as it goes: the answer stops with finish reason
    'length' after fewer tokens than `max_tokens`, as the server's own usage reports them (a count made
    here from the text could be short of the server's and is not read)."""
    choices = getattr(response, "choices", None) or [None]
    written = int(getattr(getattr(response, "usage", None), "completion_tokens", 0) or 0)
    if getattr(choices[0], "finish_reason", None) != "length" or not max_tokens or not 0 < written < max_tokens:
        return None
    return written


def _answer_room(exc: BaseException, max_tokens: int) -> int | None:
    """The answer budget to send the same prompt with when a server (vLLM, TGI, OpenAI) refused it
    because the prompt and `max_tokens` together exceed the window its words name, though the prompt
    alone leaves at least MIN_ANSWER_ROOM tokens: the window minus the prompt, as the server counts
    them. llama.cpp's servers and the embedded model take such a request and write as far as the
    window goes; this makes the strict servers do the same. None for any other failure."""
    import litellm

    text = _said(exc)
    if not (isinstance(exc, litellm.ContextWindowExceededError) or _mentions_context_limit(text)):
        return None
    window = context_window_of(text)
    requested = _REQUESTED.search(text)
    prompt = int(requested.group(1)) if requested else _number(_PROMPT.search(text))
    if not window or prompt is None:
        return None
    room = window - prompt
    return room if MIN_ANSWER_ROOM <= room < max_tokens else None


def context_window_of(server_text: str) -> int | None:
    """The context window a server's overflow error names, in tokens (None when it names none)."""
    return _number(_CONTEXT.search(server_text))


def context_window_message(model: str, server_text: str) -> str:
    """One line from a server's context-overflow error, with the figures it gave."""
    window = context_window_of(server_text)
    requested = _REQUESTED.search(server_text)
    prompt = _number(_PROMPT.search(server_text))
    budget = _number(_TOO_LARGE.search(server_text))
    if requested:
        prompt, budget = int(requested.group(1)), int(requested.group(2))
    # Neutral advice: which input is too large, and the option that makes it smaller, differ by command
    # (`planned_window_advice` names one where a program knows it).
    advice = CONTEXT_ADVICE
    if window and prompt is not None and budget is not None:
        return (f"the prompt ({prompt} tokens) and its answer budget ({budget} tokens) do not fit the "
                f"{window}-token context window of '{model}': {advice}")
    if window and prompt is not None:
        return f"the prompt ({prompt} tokens) does not fit the {window}-token context window of '{model}': {advice}"
    lines = redacted(_server_words(server_text)).splitlines()  # before the cut, as `server_text` does
    detail = f" ({lines[0][:200]})" if lines else ""
    return f"the prompt is larger than the context window of '{model}'{detail}: {advice}"


def connect_target(api_base: str) -> tuple[str, int] | None:
    """(host, port) a connection to the `api_base` server opens to; None where that cannot be told from
    here: a malformed URL (the request says what is wrong with it), or a proxy (HTTP(S)_PROXY) that
    makes the connection."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    try:
        parts = urlsplit(api_base)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    proxies = getproxies()
    if not host or ((parts.scheme in proxies or "all" in proxies) and not proxy_bypass(host)):
        return None
    return host, port


def unreachable(api_base: str) -> str | None:
    """Why no connection to the `api_base` server opens within `connect_timeout()` ('Connection refused',
    'timed out', ...); None when one does, or where that cannot be told (`connect_target`). No request
    is sent."""
    import socket

    target = connect_target(api_base)
    if target is None:
        return None
    try:
        socket.create_connection(target, timeout=connect_timeout()).close()
    except OSError as exc:
        return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return None
