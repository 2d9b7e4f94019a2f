"""A scripted LM for tests and benchmarks: program logic without a real model.

`ScriptedLM(responder)` is a real `BooklensLM` (same cache, same usage counts)
whose backend asks `responder` instead of a model. The responder sees the
parsed input fields and the names of the requested output fields and returns
a dict of outputs (or a raw string, to simulate a malformed answer).
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from booklens.lm import BooklensLM, CallCache, Completion, UsageTracker
from booklens.lm.cache import CACHE_FILE

_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n")
_OUTPUT_REQUIREMENTS = re.compile(r"\n\n(?:Respond with |Write the [\w ]+ now, as plain text)[^\n]*")


def parse_fields(content: str) -> dict[str, str]:
    """Split a DSPy chat message into its `[[ ## name ## ]]` sections."""
    # The adapter's one-line output instructions follow the last input field, or precede a per-call one.
    content = _OUTPUT_REQUIREMENTS.sub("", content, count=1)
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
    def __init__(self, responder: Callable[[ScriptedCall], Any], name: str = "scripted", context_window: int = 8192,
                 latency: float = 0.0):
        self.responder = responder
        self.name = name
        self.context_window = context_window
        self.calls: list[ScriptedCall] = []
        self.latency = latency
        # How every answer ends: "length" makes each come back as if the token cap had cut it.
        self.finish_reason = "stop"
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
        return Completion(text=text, finish_reason=self.finish_reason, prompt_tokens=prompt_tokens,
                          completion_tokens=len(text) // 4)


def ScriptedLM(
    responder: Callable[[ScriptedCall], Any],
    *,
    cache_dir: str | Path | None = None,
    context_window: int = 8192,
    latency: float = 0.0,
) -> BooklensLM:
    backend = ScriptedBackend(responder, context_window=context_window, latency=latency)
    cache = CallCache(Path(cache_dir) / CACHE_FILE) if cache_dir else None
    return BooklensLM(backend, cache=cache, usage=UsageTracker())


# ---------------------------------------------------------------------------
# An OpenAI-compatible server on loopback (it also answers Anthropic's /v1/messages), for
# end-to-end tests of the LiteLLM path: latency, resume after a kill, and the faults real servers
# and APIs produce (HTTP errors with headers, answers cut off at the token limit, dropped
# connections, answers that come too late).


def default_fake_answer(body: dict[str, Any]) -> str:
    """A short summary: plain text when the prompt asks for plain text, else JSON filling every field."""
    text = "The keeper gave away the fuel. The lamp went dark. Years later the truth came out."
    last = str((body.get("messages") or [{}])[-1].get("content", ""))
    if "as plain text" in last:
        return text
    return json.dumps({"summary": text, "condensed": text, "cleaned": text})


@dataclass
class Reply:
    """What the server does with one request (a responder may return this instead of a string).

    - `status` >= 400 answers with an error whose message is `error`, plus `headers`
      (e.g. `{"Retry-After": "7"}`); `error_code` is its `code` and `type` (OpenAI's
      `insufficient_quota`), else the code is the status;
    - `drop=True` resets the connection without answering;
    - `hold` seconds pass before answering (bounded: the server's shutdown ends the wait);
    - `raw` is sent as it is, with `status` (200 unless given) and `raw_type` as its content type (a
      page, `text/html`, unless given): a body no chat completion is, or an error in a server's own shape;
    - otherwise `content` is the answer, with `finish_reason` and usage (an answer cut off with
      'length' reports its whole budget as completion tokens unless `completion_tokens` is given; fewer
      is a window that ended it; `cached_tokens` is
      reported as `prompt_tokens_details.cached_tokens`, or Anthropic's `cache_read_input_tokens`;
      `usage=False` leaves the usage out, as some servers and proxies do); `reasoning` is sent as
      the message's `reasoning_content`, as a server that splits a model's thinking off sends it.
    """

    content: str | None = ""  # None: `content: null`
    status: int = 200
    error: str = "error"
    error_code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    drop: bool = False
    hold: float = 0.0
    usage: bool = True
    raw: str | None = None
    raw_type: str = "text/html"
    reasoning: str | None = None


@dataclass
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAIServer:
    """`POST /v1/chat/completions` answered after `latency` seconds by `responder(body)`.

    The responder returns the answer text, `(status, message)` for an HTTP error, or a `Reply`.
    `received` lists every request (path, headers, body) in arrival order; `served` lists the
    bodies that were answered completely (status 200), in order. A GET is answered from `pages`
    (path -> JSON), else with a one-model list at `/v1/models` and a 404 elsewhere; `fetched` lists
    the GETs' paths."""

    def __init__(self, latency: float = 0.0, responder: Callable[[dict[str, Any]], Any] = default_fake_answer,
                 pages: dict[str, Any] | None = None):
        import http.server
        import socketserver

        self.latency = latency
        self.responder = responder
        self.served: list[dict[str, Any]] = []
        self.received: list[ReceivedRequest] = []
        self.pages = {"/v1/models": {"object": "list", "data": [{"id": "fake", "object": "model"}]}, **(pages or {})}
        self.fetched: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._closing = threading.Event()
        lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                with lock:
                    server.fetched.append(self.path)
                if self.path in server.pages:
                    self._send(200, server.pages[self.path])
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                anthropic = self.path.rstrip("/").endswith("/messages")
                if not self.path.startswith("/v1/"):  # like real servers: the API lives under /v1
                    self._send(404, {"detail": "Not Found"})
                    return
                with lock:
                    server.received.append(ReceivedRequest(self.path, dict(self.headers.items()), body))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                counted = False
                try:
                    if server.latency:
                        server._closing.wait(server.latency)
                    reply = server.responder(body)
                    if isinstance(reply, tuple):  # (status, message): a provider error
                        reply = Reply(status=reply[0], error=reply[1])
                    elif not isinstance(reply, Reply):
                        reply = Reply(content=str(reply))
                    if reply.hold:
                        server._closing.wait(reply.hold)
                    if reply.drop:
                        # An RST instead of an answer, as when a server process dies mid-request.
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.close_connection = True
                        return
                    if reply.raw is not None:
                        data = reply.raw.encode()
                        self.send_response(reply.status)
                        self.send_header("Content-Type", reply.raw_type)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    if reply.status >= 400:
                        error = {"message": reply.error, "type": reply.error_code or "error",
                                 "code": reply.error_code or reply.status}
                        if anthropic:
                            self._send(reply.status, {"type": "error", "error": {"type": "error", "message": reply.error}},
                                       reply.headers)
                        else:
                            self._send(reply.status, {"error": error}, reply.headers)
                        return
                    prompt = reply.prompt_tokens
                    if prompt is None:
                        prompt = sum(len(str(m.get("content", ""))) // 4 for m in body.get("messages", []))
                        prompt += len(str(body.get("system", ""))) // 4
                    completion = reply.completion_tokens
                    if completion is None and reply.finish_reason == "length" and body.get("max_tokens"):
                        completion = int(body["max_tokens"])  # cut at its budget, as a server reports it
                    elif completion is None:
                        completion = len(reply.content or "") // 4
                    if anthropic:
                        payload = _anthropic_message(body, reply, prompt, completion)
                    else:
                        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                                 "total_tokens": prompt + completion}
                        if reply.cached_tokens:
                            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
                        message = {"role": "assistant", "content": reply.content}
                        if reply.reasoning is not None:
                            message["reasoning_content"] = reply.reasoning
                        payload = {
                            "id": "fake", "object": "chat.completion", "created": 0,
                            "model": body.get("model", "fake"),
                            "choices": [{"index": 0, "finish_reason": reply.finish_reason, "message": message}],
                            "usage": usage,
                        }
                        if not reply.usage:
                            del payload["usage"]
                    # Counted before the answer goes out: a client that has its answer must find the
                    # request here, and no longer in flight (after the answer, both could lag behind).
                    with lock:
                        server.served.append(body)
                        server.in_flight -= 1
                        counted = True
                    self._send(200, payload, reply.headers)
                finally:
                    if not counted:
                        with lock:
                            server.in_flight -= 1

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        # shutdown() waits for serve_forever's current poll to end: at the default 0.5 s every server a
        # test starts cost it half a second on leaving
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _anthropic_message(body: dict[str, Any], reply: Reply, prompt: int, completion: int) -> dict[str, Any]:
    stop = {"stop": "end_turn", "length": "max_tokens"}.get(reply.finish_reason, reply.finish_reason)
    usage = {"input_tokens": prompt, "output_tokens": completion,
             "cache_read_input_tokens": reply.cached_tokens, "cache_creation_input_tokens": 0}
    tools = body.get("tools") or []
    if tools:  # LiteLLM asks Anthropic for structured output through a forced tool call
        try:
            arguments = json.loads(reply.content)
        except ValueError:
            arguments = {}
        content = [{"type": "tool_use", "id": "toolu_fake", "name": tools[0]["name"], "input": arguments}]
        stop = "tool_use" if stop == "end_turn" else stop
    else:
        content = [{"type": "text", "text": reply.content}]
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model", "fake"),
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}


def free_port() -> int:
    """A loopback port nothing listens on (at the moment of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------
# A real llama.cpp server (llama-cpp-python's OpenAI-compatible server) on the embedded model.


class LlamaServer:
    """`python -m llama_cpp.server` on the embedded GGUF, on a free loopback port.

    `with LlamaServer(n_ctx=4096) as server:` starts it and waits until it answers (at most
    `start_timeout` seconds), then `server.url` is an `--api-base` and `server.lm` an `--lm`
    string; leaving the block stops it. `log` holds what the server printed.

    By default it serves the model as the embedded backend runs it: the shipped file with its weights
    stored as `booklens.lm.embedded.WEIGHTS` (written once into `weights_folder`, by default
    booklens's cache directory) and flash attention on. On one core it read a 1,270-token prompt in
    9.6 s, against 13.8 s from the shipped Q4_1 file."""

    def __init__(self, *, alias: str = "smol", n_ctx: int = 4096, n_threads: int | None = None, start_timeout: float = 120.0,
                 model_path: str | None = None, weights_folder: Path | None = None):
        from booklens.lm.embedded import FLASH_ATTENTION, WEIGHTS, default_threads, local_model_path, stored_weights

        self.alias = alias
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        self.start_timeout = start_timeout
        self.model_path = model_path or stored_weights(local_model_path(), WEIGHTS, weights_folder)
        self.flash_attention = FLASH_ATTENTION
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.lm = f"openai/{alias}"
        self._process: Any = None
        self._log: Any = None

    @property
    def log(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def __enter__(self) -> "LlamaServer":
        import subprocess
        import sys
        import tempfile
        import time
        import urllib.request

        self._log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "llama_cpp.server", "--model", self.model_path, "--model_alias", self.alias,
                   "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                   "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
                   "--flash_attn", str(self.flash_attention), "--verbose", "False"]
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self.log.strip().splitlines()[-3:]
                self._log.close()
                raise RuntimeError(f"llama.cpp server exited with {self._process.returncode}: {' | '.join(tail)}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"llama.cpp server did not answer within {self.start_timeout:.0f} s")

    def __exit__(self, *exc: Any) -> None:
        import subprocess

        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=15)


def _die_with_parent() -> None:
    """In the server's process: end it when the process that started it ends, however that happens."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
# ---------------------------------------------------------------------------
# Plausible answers for every step of the book pipeline, for end-to-end tests and benchmarks of
# `booklens run` and `booklens sweep` against `FakeOpenAIServer`.


def run_as_nobody(work: Callable[[], str]) -> str:
    """What `work()` returns, run by a user who cannot write a folder whose mode says read-only:
    root writes anyway, so as root it runs in a child process that has given up root."""
    import os

    if os.geteuid() != 0:
        return work()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            try:
                out = work()
            except BaseException as exc:  # said in the parent's failure, not lost with the child
                out = f"the child failed: {exc!r}"
            os.write(write, out.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(child, 0)
    return out


def pipeline_step(body: dict[str, Any]) -> str:
    """Which pipeline step a chat request belongs to: summarize, coherence, claims, verify or other."""
    messages = body.get("messages") or [{}]
    system = str(messages[0].get("content", ""))
    last = str(messages[-1].get("content", ""))
    if "as plain text" in last:
        return "summarize"
    if "[[ ## sentence ## ]]" in last or "[[ ## sentences ## ]]" in last:
        return "coherence"
    if "`claims`" in system:
        return "claims"
    if "`label`" in system:
        return "verify"
    return "other"


_OUTPUT_NAMED = re.compile(r"You answer with the `(\w+)`|Your output fields are:\n1\. `(\w+)`")


def requested_output(body: dict[str, Any]) -> str | None:
    """The (first) output field a chat request asks for, as its system message names it: which
    signature it serves, whether the answer is plain text or JSON."""
    messages = body.get("messages") or [{}]
    found = _OUTPUT_NAMED.search(str(messages[0].get("content", "")))
    return (found.group(1) or found.group(2)) if found else None


def is_cleanup(body: dict[str, Any]) -> bool:
    """Whether a chat request is the artifact-removal pass: its prompt asks for plain text as a
    summary's does, so its signature's output field is what tells them apart."""
    from booklens.signatures.summarize import RemoveArtifacts

    return requested_output(body) in RemoveArtifacts.output_fields


_NAME = re.compile(r"\b[A-Z][a-z]{3,}\b")
_COMMON = {"This", "That", "There", "They", "Then", "When", "What", "With", "Your", "From", "Have", "Here",
           "Well", "Very", "Some", "Such", "Will", "Would", "Could", "Should", "Their", "These", "Those", "Respond",
           "Write", "Which", "While", "After", "Before", "Project", "Gutenberg", "Chapter", "Summary", "Level"}


class PipelineResponder:
    """Deterministic, plausible answers that depend on the request: a summary names the two most
    frequent names of its input and a page number drawn from the prompt's digest (so different
    books and systems get different summaries, and no two cells send the same judge request); a
    sentence about hiding something confuses the judge, asked one at a time or in a batch; claims
    are the summary's sentences; a claim about hiding is unfaithful, the others faithful; the
    artifact-removal pass returns the summary unchanged. `delay` slows every answer down."""

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

    @staticmethod
    def verdict(sentence: str) -> dict[str, Any]:
        if "hides" in sentence:
            return {"verdict": "confusion", "questions": ["What is in the letter?"], "error_types": ["entity omission"]}
        return {"verdict": "no confusion", "questions": [], "error_types": []}

    def __call__(self, body: dict[str, Any]) -> str:
        if self.delay:
            import time

            time.sleep(self.delay)
        step = pipeline_step(body)
        last = str(body["messages"][-1]["content"])
        if step == "summarize":
            if is_cleanup(body):  # nothing in a summary is an artifact: it comes back as it was
                return parse_fields(last).get("summary", "")
            return self.summary(last)
        if step == "coherence":
            fields = parse_fields(last)
            if "sentences" in fields:  # batched: '<number>: <sentence>' per line, one answer each
                answers = []
                for line in fields["sentences"].splitlines():
                    number, _, sentence = line.partition(":")
                    if number.strip().isdigit():
                        answers.append({"number": int(number), **self.verdict(sentence)})
                return json.dumps({"answers": answers})
            return json.dumps(self.verdict(fields.get("sentence", "")))
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
        # asked for JSON (another adapter): the artifact-removal pass gives the summary back too
        cleaned = parse_fields(last).get("summary") or text
        return json.dumps({"summary": text, "condensed": text, "cleaned": cleaned})


# A command started in the background by a non-interactive shell (as CI may start the tests)
# inherits SIGINT ignored, and Python then keeps ignoring it, as it should: this launcher restores
# the default before booklens starts, as a terminal's foreground command has it.
_AS_FROM_A_TERMINAL = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "os.execv(sys.executable, [sys.executable, '-m', 'booklens', *sys.argv[1:]])"
)


def terminal_command(args: list[Any]) -> list[str]:
    """The argv of a process that runs `booklens ARGS` and takes Ctrl-C (SIGINT) as it would from
    a terminal, for tests that interrupt a command."""
    import sys

    return [sys.executable, "-c", _AS_FROM_A_TERMINAL, *map(str, args)]


def run_command(args: list[Any], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `booklens ARGS` in this process as the `booklens` script does, and return what a
    `subprocess.run(..., capture_output=True, text=True)` of the script would: the exit code and
    what the command wrote to stdout and stderr. `env`, when given, is the whole environment for the
    call; the process's own comes back afterwards. A second command costs no fresh start (DSPy and
    LiteLLM stay imported), so tests of what a command writes and prints use this; tests that kill a
    run, or check the installed script itself, start a real process."""
    import contextlib
    import gc
    import io
    import os
    import sys

    from booklens.cli import main

    argv = ["booklens", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_gc = dict(os.environ), sys.argv, gc.get_threshold()
    code: Any = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        sys.argv = argv
        if "booklens.lm.model" in sys.modules:  # as a new process would: a server may reuse a stopped one's port
            sys.modules["booklens.lm.model"].forget_servers()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        # main() tunes the collector for a process that ends with the command; this one goes on,
        # and what the command left in reference cycles (its LMs, caches, programs) must be freed.
        from booklens.collector import stop_deferring

        stop_deferring()
        gc.unfreeze()
        gc.set_threshold(*saved_gc)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it and exits with 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
