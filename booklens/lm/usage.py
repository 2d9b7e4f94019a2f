"""Usage accounting: LM calls, tokens and cost per run and per named step.

The one place where calls are counted. Calls answered from the disk cache cost nothing now and
are counted apart, with the tokens and cost they had when first made, so a resumed run can
report the same figures as an uninterrupted one (`work_between`).

A cost is stated by one rule, `known_cost`: work costs the sum of its calls' prices only when
every call that counted had one (LiteLLM knew the model's prices); otherwise it is unknown (None).
Records, a sweep's aggregate and report, its progress line and its `--dry-run` estimate all use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Optional

from booklens.vocabulary import counted

_current_step: contextvars.ContextVar[str] = contextvars.ContextVar("booklens_step", default="default")


@contextlib.contextmanager
def usage_step(name: str) -> Iterator[None]:
    """Attribute LM calls made inside this block (and threads it starts) to a named step."""
    token = _current_step.set(name)
    try:
        yield
    finally:
        _current_step.reset(token)


def current_step() -> str:
    return _current_step.get()


# Trackers of the usage scopes open in this context (a cell of a sweep, a step of a run): every
# call is also counted in each of them, so work done on a shared LM by concurrent cells is
# attributed exactly. Threads started by `booklens.parallel` copy the context, and the scopes.
_scopes: contextvars.ContextVar[tuple["UsageTracker", ...]] = contextvars.ContextVar("booklens_usage_scopes",
                                                                                    default=())


@contextlib.contextmanager
def usage_scope() -> Iterator["UsageTracker"]:
    """Count the LM calls made inside this block (and the threads it starts) in a tracker of its own."""
    tracker = UsageTracker()
    token = _scopes.set(_scopes.get() + (tracker,))
    try:
        yield tracker
    finally:
        _scopes.reset(token)


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
    cached_provider_cached_tokens: int = 0
    # Calls without a price (fresh, and answered from the cache): `cost_usd` and `cached_cost_usd`
    # sum the others', so a cost stated from these counts is unknown while these are not 0 (`known_cost`).
    unpriced_calls: int = 0
    cached_unpriced_calls: int = 0
    # Prompt tokens of fresh calls that the provider read from its own prompt cache
    # (`prompt_tokens_details.cached_tokens`); they are part of prompt_tokens and cost_usd
    # already prices them at the provider's cached rate.
    provider_cached_tokens: int = 0

    def add(self, *, cached: bool, prompt_tokens: int, completion_tokens: int, cost: float | None,
            provider_cached_tokens: int = 0) -> None:
        if cached:
            self.cached_calls += 1
            self.cached_prompt_tokens += prompt_tokens
            self.cached_completion_tokens += completion_tokens
            self.cached_provider_cached_tokens += provider_cached_tokens
            if cost is None:
                self.cached_unpriced_calls += 1
            else:
                self.cached_cost_usd = (self.cached_cost_usd or 0.0) + cost
            return
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.provider_cached_tokens += provider_cached_tokens
        self.completion_tokens += completion_tokens
        if cost is None:
            self.unpriced_calls += 1
        else:
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def as_dict(self) -> dict[str, Any]:
        """The counters (a snapshot): they add up over trackers and subtract between snapshots. The
        cost of the calls they count is `snapshot_cost`, not `cost_usd`, which sums the priced ones."""
        return {
            "calls": self.calls,
            "cached_calls": self.cached_calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "cached_completion_tokens": self.cached_completion_tokens,
            "cached_cost_usd": None if self.cached_cost_usd is None else round(self.cached_cost_usd, 6),
            "provider_cached_tokens": self.provider_cached_tokens,
            "cached_provider_cached_tokens": self.cached_provider_cached_tokens,
            "unpriced_calls": self.unpriced_calls,
            "cached_unpriced_calls": self.cached_unpriced_calls,
        }


@dataclass
class UsageTracker:
    """Counts of LM calls made by this process. Cached calls cost nothing and are counted apart."""

    total: StepUsage = field(default_factory=StepUsage)
    steps: dict[str, StepUsage] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, *, cached: bool, prompt_tokens: int = 0, completion_tokens: int = 0, cost: float | None = None,
               provider_cached_tokens: int = 0) -> None:
        """Count one call here and in every usage scope open in the caller's context."""
        counts = dict(cached=cached, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost=cost,
                      provider_cached_tokens=provider_cached_tokens)
        for tracker in (self, *(t for t in _scopes.get() if t is not self)):
            tracker.count(**counts)

    def count(self, **counts: Any) -> None:
        """Count one call in this tracker only (under the current step), not in the open scopes."""
        step = current_step()
        with self._lock:
            self.total.add(**counts)
            self.steps.setdefault(step, StepUsage()).add(**counts)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.total.as_dict(), "steps": {k: v.as_dict() for k, v in self.steps.items()}}

    def work(self) -> dict[str, Any]:
        """Every call counted here, with those the cache answered (also given apart as
        `cached_calls`) at the tokens and cost they had when first made (`work_between`)."""
        return record_usage(StepUsage().as_dict(), self.snapshot())


def record_usage(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The usage a command's record gives for the work between two `snapshot()`s: every call, with
    those the cache answered at the tokens and cost they had when first made (`work_between`, so
    a resumed command records what an uninterrupted one does), and how many the cache answered."""
    return {**work_between(before, after), "cached_calls": after["cached_calls"] - before["cached_calls"]}


# The figures of LM work a run records per step and a sweep per cell (`work_between`).
WORK_KEYS = ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "provider_cached_tokens")
WORK_COUNTS = tuple(key for key in WORK_KEYS if key != "cost_usd")


def known_cost(parts: Iterable[tuple[int, Optional[float]]]) -> Optional[float]:
    """The one rule for what LM work cost. `parts` are (calls, USD of those calls, None when any of
    them had no price). The cost is known only when every part that made a call is priced: then it
    is their sum; otherwise it is unknown (None), as it is when no call was made at all."""
    total, priced = 0.0, False
    for calls, cost in parts:
        if not calls:
            continue
        if cost is None:
            return None
        total += float(cost)
        priced = True
    return round(total, 6) if priced else None


def cost_text(cost: Optional[float]) -> str:
    """A cost as every page and line shows it: '$0.0123', '$12.34', or 'unknown' (`known_cost`)."""
    if cost is None:
        return "unknown"
    return f"${cost:,.4f}" if cost < 1 else f"${cost:,.2f}"


def snapshot_cost(after: Mapping[str, Any], before: Optional[Mapping[str, Any]] = None) -> Optional[float]:
    """What the calls counted between two snapshots (`StepUsage.as_dict`) cost, fresh and cached alike,
    by `known_cost` (`before` None: every call of `after`)."""
    before = before or {}

    def part(prefix: str) -> tuple[int, Optional[float]]:
        calls = int(after.get(f"{prefix}calls") or 0) - int(before.get(f"{prefix}calls") or 0)
        unpriced = (int(after.get(f"{prefix}unpriced_calls") or 0)
                    - int(before.get(f"{prefix}unpriced_calls") or 0))
        spent = after.get(f"{prefix}cost_usd")
        if unpriced or spent is None:
            return calls, None
        return calls, float(spent) - float(before.get(f"{prefix}cost_usd") or 0.0)

    return known_cost([part(""), part("cached_")])


def total_work(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of `work_between` figures (a run's steps, a sweep's cells): counts add up, and the
    cost is known only when every item that made a call knows its own (`known_cost`)."""
    items = list(items)
    total: dict[str, Any] = {key: 0 for key in WORK_COUNTS}
    for item in items:
        for key in WORK_COUNTS:
            total[key] += int(item.get(key) or 0)
    total["cost_usd"] = known_cost((int(item.get("calls") or 0), item.get("cost_usd")) for item in items)
    return {key: total[key] for key in WORK_KEYS}


def describe_calls(usage: dict[str, Any], *, tokens: bool = True) -> str:
    """The commands' line on a record's usage (`record_usage`, `work()`): 'N LM calls (M from
    cache)', where N counts every call, those the cache answered included, then the tokens of all
    N as they were when made."""
    calls, cached = int(usage.get("calls", 0) or 0), int(usage.get("cached_calls", 0) or 0)
    line = f"{counted(calls, 'LM call')} ({cached} from cache)"
    if tokens:
        line += f", {usage.get('prompt_tokens', 0)} prompt + {usage.get('completion_tokens', 0)} completion tokens"
    return line


def work_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """LM work between two usage snapshots, counting calls answered from the cache with the tokens
    and cost they had when first made: the same figures whether or not a run was resumed."""
    calls = (after["calls"] + after["cached_calls"]) - (before["calls"] + before["cached_calls"])
    prompt = (after["prompt_tokens"] + after.get("cached_prompt_tokens", 0)
              - before["prompt_tokens"] - before.get("cached_prompt_tokens", 0))
    completion = (after["completion_tokens"] + after.get("cached_completion_tokens", 0)
                  - before["completion_tokens"] - before.get("cached_completion_tokens", 0))
    provider_cached = (after.get("provider_cached_tokens", 0) + after.get("cached_provider_cached_tokens", 0)
                       - before.get("provider_cached_tokens", 0) - before.get("cached_provider_cached_tokens", 0))
    return {"calls": calls, "prompt_tokens": prompt, "completion_tokens": completion,
            "cost_usd": snapshot_cost(after, before), "provider_cached_tokens": provider_cached}
