"""A scripted LM for tests and benchmarks: program logic without a real model.

`ScriptedLM(responder)` is a real `BooklensLM` (same cache, same usage counts)
whose backend asks `responder` instead of a model. The responder sees the
parsed input fields and the names of the requested output fields and returns
a dict of outputs (or a raw string, to simulate a malformed answer).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, Callable

from booklens.lm import BooklensLM, CallCache, Completion, UsageTracker

_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n")


def parse_fields(content: str) -> dict[str, str]:
    """Split a DSPy chat message into its `[[ ## name ## ]]` sections."""
    parts = _FIELD.split(content)
    fields = {}
    for i in range(1, len(parts) - 1, 2):
        fields[parts[i]] = parts[i + 1].strip()
    return fields


class ScriptedCall:
    def __init__(self, messages: list[dict[str, Any]], request: dict[str, Any]):
        self.messages = messages
        self.request = request
        self.system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        self.inputs = parse_fields(messages[-1]["content"])
        schema = request.get("schema") or {}
        self.output_fields = list((schema.get("properties") or {}).keys())
        self.attempt = int(request.get("attempt") or 0)

    def wants(self, *names: str) -> bool:
        return all(n in self.output_fields for n in names)


class ScriptedBackend:
    wants_schema = True  # like the embedded model, always receive the output schema

    def __init__(self, responder: Callable[[ScriptedCall], Any], name: str = "scripted", context_window: int = 8192,
                 latency: float = 0.0):
        self.responder = responder
        self.name = name
        self.context_window = context_window
        self.calls: list[ScriptedCall] = []
        self.latency = latency
        self._lock = threading.Lock()

    def complete(self, request: dict[str, Any]) -> Completion:
        call = ScriptedCall(request["messages"], request)
        with self._lock:
            self.calls.append(call)
        if self.latency:
            import time

            time.sleep(self.latency)
        answer = self.responder(call)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        prompt_tokens = sum(len(m["content"]) for m in request["messages"]) // 4
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=len(text) // 4)


def ScriptedLM(
    responder: Callable[[ScriptedCall], Any],
    *,
    cache_dir: str | Path | None = None,
    context_window: int = 8192,
    latency: float = 0.0,
) -> BooklensLM:
    backend = ScriptedBackend(responder, context_window=context_window, latency=latency)
    cache = CallCache(Path(cache_dir) / "calls.sqlite") if cache_dir else None
    return BooklensLM(backend, cache=cache, usage=UsageTracker())
