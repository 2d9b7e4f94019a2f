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
_OUTPUT_REQUIREMENTS = re.compile(r"\n\n(?:Respond with |Write the [\w ]+ now, as plain text)")


def parse_fields(content: str) -> dict[str, str]:
    """Split a DSPy chat message into its `[[ ## name ## ]]` sections."""
    # The adapter appends its output instructions after the last input field.
    content = _OUTPUT_REQUIREMENTS.split(content, 1)[0]
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
        if request.get("plain_output"):
            self.output_fields = [request["plain_output"]]
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
        if isinstance(answer, dict) and request.get("plain_output"):
            answer = str(answer.get(request["plain_output"], ""))  # plain-text answers carry no JSON
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


# ---------------------------------------------------------------------------
# An OpenAI-compatible server on loopback with a fixed latency, for end-to-end
# tests of the LiteLLM path (resume after a kill) and concurrency benchmarks.


def default_fake_answer(body: dict[str, Any]) -> str:
    """A short summary: plain text when the prompt asks for plain text, else JSON filling every field."""
    text = "The keeper gave away the fuel. The lamp went dark. Years later the truth came out."
    last = str((body.get("messages") or [{}])[-1].get("content", ""))
    if "as plain text" in last:
        return text
    return json.dumps({"summary": text, "condensed": text, "cleaned": text})


class FakeOpenAIServer:
    """`POST /v1/chat/completions` answered after `latency` seconds by `responder(body) -> str`.

    `served` lists the request bodies that were answered completely, in order. A responder
    may return `(status, message)` to answer with an HTTP error instead."""

    def __init__(self, latency: float = 0.0, responder: Callable[[dict[str, Any]], str] = default_fake_answer):
        import http.server
        import socketserver

        self.latency = latency
        self.responder = responder
        self.served: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server.latency:
                        import time

                        time.sleep(server.latency)
                    content = server.responder(body)
                    if isinstance(content, tuple):  # (status, message): simulate a provider error
                        status, message = content
                        error = json.dumps({"error": {"message": message, "type": "error", "code": status}}).encode()
                        self.send_response(status)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(error)))
                        self.end_headers()
                        self.wfile.write(error)
                        return
                    payload = json.dumps({
                        "id": "fake", "object": "chat.completion", "created": 0, "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": sum(len(str(m.get("content", ""))) // 4
                                                       for m in body.get("messages", [])),
                                  "completion_tokens": len(content) // 4,
                                  "total_tokens": 0},
                    }).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    with lock:
                        server.served.append(body)
                finally:
                    with lock:
                        server.in_flight -= 1

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# ---------------------------------------------------------------------------
# Plausible answers for every step of the book pipeline, for end-to-end tests and benchmarks of
# `booklens run` and `booklens sweep` against `FakeOpenAIServer`.


def pipeline_step(body: dict[str, Any]) -> str:
    """Which pipeline step a chat request belongs to: summarize, coherence, claims, verify or other."""
    messages = body.get("messages") or [{}]
    system = str(messages[0].get("content", ""))
    last = str(messages[-1].get("content", ""))
    if "as plain text" in last:
        return "summarize"
    if "[[ ## sentence ## ]]" in last:
        return "coherence"
    if "`claims`" in system:
        return "claims"
    if "`label`" in system:
        return "verify"
    return "other"


_NAME = re.compile(r"\b[A-Z][a-z]{3,}\b")
_COMMON = {"This", "That", "There", "They", "Then", "When", "What", "With", "Your", "From", "Have", "Here",
           "Well", "Very", "Some", "Such", "Will", "Would", "Could", "Should", "Their", "These", "Those", "Respond",
           "Write", "Which", "While", "After", "Before", "Project", "Gutenberg", "Chapter", "Summary", "Level"}


class PipelineResponder:
    """Deterministic, plausible answers that depend on the request: a summary names the two most
    frequent names of its input and a page number drawn from the prompt's digest (so different
    books and systems get different summaries, and no two cells send the same judge request); a
    sentence about hiding something confuses the judge; claims are the summary's sentences; a
    claim about hiding is unfaithful, the others faithful. `delay` slows every answer down."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def summary(self, last: str) -> str:
        import hashlib
        from collections import Counter

        fields = parse_fields(last)
        source = " ".join(v for k, v in fields.items() if k not in ("word_limit", "current_words")) or last
        names = [n for n, _ in Counter(w for w in _NAME.findall(source) if w not in _COMMON).most_common(2)]
        first, second = (names + ["the narrator", "a stranger"])[:2]
        page = 100 + int(hashlib.sha256(last.encode("utf-8")).hexdigest()[:8], 16) % 900
        # Every sentence names the page, so no two summaries share a sentence (or a claim).
        sentences = [f"{first} and {second} meet on page {page}.",
                     f"On page {page}, {second} hides a letter from {first}." if page % 2 else
                     f"On page {page}, {second} tells {first} everything.",
                     f"By the end of page {page + 1}, {first} knows what happened."]
        return " ".join(sentences)

    def __call__(self, body: dict[str, Any]) -> str:
        if self.delay:
            import time

            time.sleep(self.delay)
        step = pipeline_step(body)
        last = str(body["messages"][-1]["content"])
        if step == "summarize":
            return self.summary(last)
        if step == "coherence":
            sentence = parse_fields(last).get("sentence", "")
            if "hides" in sentence:
                return json.dumps({"verdict": "confusion", "questions": ["What is in the letter?"],
                                   "error_types": ["entity omission"]})
            return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})
        if step == "claims":
            from booklens.text import split_sentences

            return json.dumps({"claims": split_sentences(parse_fields(last).get("summary", ""))})
        if step == "verify":
            claim = parse_fields(last).get("claim", "")
            label = "unfaithful" if "hides" in claim else "faithful"
            return json.dumps({"label": label, "supporting_passages": [] if label == "unfaithful" else [1],
                               "refuting_passages": [1] if label == "unfaithful" else [],
                               "reason": f"Passage 1 {'contradicts' if label == 'unfaithful' else 'supports'} it."})
        text = self.summary(last)
        return json.dumps({"summary": text, "condensed": text, "cleaned": text})
