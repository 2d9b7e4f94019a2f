"""Requests and tokens per minute, shared by every thread that calls one provider.

The accounting is pyrate-limiter's sliding-window log (its in-memory bucket); this module only
decides what one call weighs and waits as long as the bucket says. The clock and the sleep are
parameters so that tests can run minutes of limits without waiting for them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

MINUTE_MS = 60_000
# A request takes its slot a little before it leaves (LiteLLM's first call in a process spends
# about a second getting ready), so slots are counted over a minute and this much more: the server
# never sees more than the limit in any 60 seconds of arrivals.
SEND_MARGIN_MS = 2_000
# pyrate-limiter's bucket keeps one entry per unit of weight. Under a token limit larger than this many
# units, a unit stands for several tokens (a request rounded up to whole units), so the bucket never holds
# more entries than this, whatever the limit or a request's answer budget (a list of 8 MB at most). A
# request weighs one entry, so the requests' bucket holds no more than the requests sent in a window.
MAX_UNITS = 1_000_000


class RateLimiter:
    """At most `rpm` requests and `tpm` tokens in any 60-second window (either may be None); the
    limiter's own window is `SEND_MARGIN_MS` longer, for the time between a slot and the send.

    A call weighs its prompt tokens plus its answer budget (`max_tokens`), as providers count a
    request against a token limit when it arrives. A call heavier than a whole minute's token
    allowance still goes, alone in its window, rather than never."""

    def __init__(self, rpm: int | None = None, tpm: int | None = None, *, clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None):
        from pyrate_limiter import InMemoryBucket, Rate

        if (rpm is not None and rpm < 1) or (tpm is not None and tpm < 1):
            raise ValueError("rate limits must be positive")
        self.rpm = rpm
        self.tpm = tpm
        self._buckets = {}
        for name, limit in (("requests", rpm), ("tokens", tpm)):
            if limit:
                unit = -(-limit // MAX_UNITS) if name == "tokens" else 1  # tokens per entry: 1 up to MAX_UNITS
                units = limit // unit  # rounded down: the units allowed never add up to more than the limit
                self._buckets[name] = (InMemoryBucket([Rate(units, MINUTE_MS + SEND_MARGIN_MS)]), units, unit)
        self._clock = clock or time.monotonic
        if sleep is None:
            from booklens.parallel import pause as sleep  # a wait ends at Ctrl-C
        self._sleep = sleep
        self._lock = threading.Lock()
        self.waits: list[float] = []  # seconds each held call was asked to wait

    @property
    def active(self) -> bool:
        return bool(self._buckets)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def acquire(self, tokens: int = 0) -> None:
        """Block until one request of `tokens` tokens fits both limits, then count it in both.

        Both are checked at one moment and counted together: a request counted in one window while it
        waited for the other would leave later than its count says, and the server could then see more
        than the limit in a minute (three requests at once under --rpm 2 --tpm 1000)."""
        from pyrate_limiter import RateItem

        weights = {"requests": 1, "tokens": max(1, tokens)}
        while True:
            with self._lock:
                now = self._now_ms()
                wait_ms = 0
                for bucket, _, _ in self._buckets.values():
                    bucket.leak(now)  # forget what left the window, so memory stays bounded
                # in whole units, and at most the whole limit: a heavier request goes alone in its window
                units = {name: min(-(-weights[name] // unit), limit)
                         for name, (_, limit, unit) in self._buckets.items()}
                for name, (bucket, limit, _) in self._buckets.items():
                    wait_ms = max(wait_ms, _wait_ms(bucket, units[name], limit, now))
                if not wait_ms:
                    for name, (bucket, _, _) in self._buckets.items():
                        bucket.put(RateItem(name, now, units[name]))
                    return
                seconds = wait_ms / 1000
                self.waits.append(seconds)
            self._sleep(seconds)


def _wait_ms(bucket: Any, weight: int, limit: int, now: int) -> int:
    """Milliseconds until `weight` more fits in the window of `bucket` (0: it fits now), from what the
    bucket holds after `leak(now)`: one item per unit, newest first by `peek`."""
    leaving = bucket.count() + weight - limit  # how many must leave the window first
    if leaving <= 0:
        return 0
    last_to_leave = bucket.peek(bucket.count() - leaving)
    return max(1, last_to_leave.timestamp + MINUTE_MS + SEND_MARGIN_MS + 1 - now)


def count_tokens(*, messages: list[dict[str, Any]] | None = None, text: str | None = None) -> int:
    """Tokens of `messages` or of `text` by LiteLLM's default (tiktoken) encoding, else about four
    characters a token. Never by the model's name: for some names (one holding 'llama-3', say) LiteLLM
    fetches a tokenizer from the Hugging Face Hub, which offline is tried, and warned about, at every call."""
    try:
        import litellm

        if messages is not None:
            return int(litellm.token_counter(messages=messages))
        return int(litellm.token_counter(text=text or ""))
    except Exception:
        if messages is not None:
            return sum(len(str(m.get("content", ""))) for m in messages) // 4
        return len(text or "") // 4


def estimate_tokens(messages: list[dict[str, Any]], max_tokens: int) -> int:
    """What a request counts against a tokens-per-minute limit: its prompt plus its answer budget."""
    return count_tokens(messages=messages) + int(max_tokens)
