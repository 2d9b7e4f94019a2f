"""The LMs of one process: one disk cache and one limit of calls in flight, shared.

A sweep runs many cells at once, each with a summarizer LM and a judge LM that may differ per
system. `LMPool` hands out one `BooklensLM` per (model, server); all of them answer from and
write to the same cache, count into the same tracker, and queue behind one semaphore, so
`--concurrency` bounds the backend calls of the whole process however many cells run. The
embedded model is loaded once per process (`booklens.lm.local_backend`). A Ray worker makes
one pool for its lifetime.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from booklens.lm.base import lm_label
from booklens.lm.cache import CACHE_FILE, CallCache, cache_folder
from booklens.lm.embedded import LOCAL_LM
from booklens.lm.usage import UsageTracker


def named_server(name: str, api_base: str | None = None) -> str | None:
    """The server the model `name` is reached at: none for the embedded model, else `api_base`, or
    the one the environment names (`resolve_server`: BOOKLENS_API_BASE, OPENAI_BASE_URL, ...), as its
    backend calls it. A run's records and its steps' digests name this server, so a run reached
    another way (by a variable, not --api-base) at another server is not taken for the same run."""
    from booklens.lm.remote import resolve_server

    return None if name == LOCAL_LM else resolve_server(name, api_base)


def resolve_model(default_lm: str | None, default_api_base: str | None, lm: str | None = None,
                  api_base: str | None = None) -> tuple[str, str | None]:
    """(model string, server) an LM option names: `default_lm` and `default_api_base` where not given
    (an empty or blank value is one not given, as an empty --api-base is), the server as its backend
    reaches it (`named_server`)."""
    from booklens.lm.embedded import resolve_lm_name

    name = (lm or resolve_lm_name(default_lm)).strip()
    return name, named_server(name, api_base if api_base and api_base.strip() else default_api_base)


def rate_limit_key(name: str, server: str | None) -> str:
    """What one `--rpm`/`--tpm` limit counts the requests of: the server they go to, whatever the
    model (`server`, the URL as `named_server` gives it), or the provider's own endpoint when none
    is named (`openai/`, `anthropic/`, ...). A server's capacity, or a proxy's limit, is no larger
    for being asked for two models."""
    if server:
        return server
    if name == LOCAL_LM:
        return name  # (it takes no limits)
    provider = name.split("/", 1)[0] if "/" in name else ""
    if not provider:
        try:
            import litellm

            provider = litellm.get_llm_provider(name)[1]  # 'gpt-4o-mini' is OpenAI's
        except Exception:
            provider = name
    return f"{provider}/"


class LMPool:
    def __init__(self, default_lm: str | None = None, api_base: str | None = None, *,
                 cache_dir: Path | str | None = None, concurrency: int = 4, use_cache: bool = True,
                 structured: str | None = None, rpm: int | None = None, tpm: int | None = None,
                 call_limit: Any = None, limiter_for: Any = None):
        from booklens.lm.embedded import check_lm_strings, resolve_lm_name
        from booklens.parallel import check_at_least

        check_lm_strings(default_lm, api_base)
        check_at_least("concurrency", concurrency)
        self.default_lm = resolve_lm_name(default_lm)
        self.api_base = api_base
        self.concurrency = concurrency
        self.cache_dir = cache_folder(cache_dir)
        self.cache = CallCache(self.cache_dir / CACHE_FILE) if use_cache else None
        self.usage = UsageTracker()
        # A given `call_limit` (a context manager around each backend call) replaces the pool's own
        # semaphore: a Ray worker's pool takes its slots from the whole sweep's (`sweep.engines`).
        self.call_limit = call_limit if call_limit is not None else threading.BoundedSemaphore(self.concurrency)
        self._lms: dict[tuple[str, str | None], Any] = {}
        # Backend options of every LM the pool makes (`make_lm`). The rate limits hold per server: the
        # LMs of one server share one limiter (`rate_limit_key`), made by `limiter_for(key)` when given
        # (a Ray sweep's limiters are counted for all its workers, `sweep.engines`).
        self.lm_options = {"structured": structured, "rpm": rpm, "tpm": tpm}
        self.limiter_for = limiter_for
        self._limiters: dict[str, Any] = {}
        self._lock = threading.Lock()

    def resolve(self, lm: str | None = None, api_base: str | None = None) -> tuple[str, str | None]:
        """(model string, server) an LM option names: the pool's default model and server where not
        given, the server as its backend reaches it (`named_server`)."""
        return resolve_model(self.default_lm, self.api_base, lm, api_base)

    def get(self, lm: str | None = None, api_base: str | None = None):
        """The pool's `BooklensLM` for a model (built and checked on first use)."""
        from booklens.lm.model import make_lm

        key = self.resolve(lm, api_base)
        with self._lock:
            if key not in self._lms:
                self._lms[key] = make_lm(key[0], api_base=key[1], cache=self.cache, usage=self.usage,
                                         call_limit=self.call_limit, use_cache=self.cache is not None,
                                         limiter=self._limiter(*key), **self.lm_options)
            return self._lms[key]

    def _limiter(self, name: str, server: str | None) -> Any:
        """The rate limiter of the server `name` is reached at, made on first use (None: no limits)."""
        from booklens.lm.model import backend_settings, make_limiter

        where = rate_limit_key(name, server)
        if where not in self._limiters:
            if self.limiter_for is not None:
                self._limiters[where] = self.limiter_for(where)
            else:
                backend_settings(name, api_base=server, **self.lm_options)  # a bad setting refused in its turn
                self._limiters[where] = make_limiter(self.lm_options["rpm"], self.lm_options["tpm"])
        return self._limiters[where]


class FixedLMPool:
    """A pool that hands out one given LM for every model: for code that brings its own
    `dspy`-compatible LM (tests with a scripted LM, programs embedding booklens)."""

    def __init__(self, lm: Any, *, cache_dir: Path | str | None = None):
        from booklens.lm.model import require_lm

        self.lm = require_lm(lm, "FixedLMPool")  # a model's name goes to LMPool(name)
        self.cache_dir = cache_folder(cache_dir)
        self.usage = getattr(lm, "usage", None)

    def resolve(self, lm: str | None = None, api_base: str | None = None) -> tuple[str, str | None]:
        return lm_label(self.lm), None

    def get(self, lm: str | None = None, api_base: str | None = None) -> Any:
        return self.lm
