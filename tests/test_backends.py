"""LiteLLM backends against a loopback server that answers like real servers and APIs do: the
structured-output dialects, faults (429 and Retry-After, overload, timeouts, dropped and refused
connections, cut-off answers, context overflow), single-flight, rate limits, provider-side prompt
caching and cache markers on the wire. Nothing of booklens' LM code is patched: the server
misbehaves, and the backend gets an injected `sleep` so no test waits out a backoff."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from typing import Literal

import dspy
import pytest

from booklens.errors import LMError
from booklens.lm import (
    BooklensAdapter,
    BooklensLM,
    CallCache,
    ContextWindowExceeded,
    LiteLLMBackend,
    RateLimiter,
    make_backend,
    make_lm,
    predict_with_retries,
)
from booklens.parallel import Stopped, parallel_map, stoppable
# booklens' Predict: DSPy's own reads every frame of the stack on each call (booklens.programs.base)
from booklens.programs.base import Predict
from booklens.testing import FakeOpenAIServer, Reply, ScriptedLM, free_port

# The answer llama-cpp-python's server (0.3.x) gives to a `json_schema` response format, verbatim.
LLAMA_CPP_PYTHON_REFUSAL = (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
    "'ctx': {'expected': \"'text' or 'json_object'\"}}"
)


class Classify(dspy.Signature):
    """Label the text."""

    text: str = dspy.InputField()
    label: Literal["good", "bad"] = dspy.OutputField()


class Recorder:
    """An injected sleep: records the delays asked for, waits for none."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def backend_for(server, model="openai/fake-model", **kwargs) -> LiteLLMBackend:
    kwargs.setdefault("sleep", Recorder())
    return LiteLLMBackend(model, api_base=server.url, **kwargs)


def classify(backend, text="x", cache_dir=None, **config):
    cache = CallCache(cache_dir / "calls.sqlite") if cache_dir else None
    lm = BooklensLM(backend, cache=cache)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        return Predict(Classify)(text=text, config=config), lm


def formats(server) -> list:
    return [r.body.get("response_format") for r in server.received]


# ---------------------------------------------------------------------------
# Structured outputs


def test_servers_get_the_output_schema_as_json_schema_and_free_text_gets_none():
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        prediction, _ = classify(backend_for(server))
    assert prediction.label == "good"
    sent = server.received[0].body["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
    assert sent["json_schema"]["schema"]["properties"]["label"]["enum"] == ["good", "bad"]

    class Describe(dspy.Signature):
        """Describe the text."""

        text: str = dspy.InputField()
        description: str = dspy.OutputField()

    with FakeOpenAIServer(responder=lambda body: "A calm day.") as server:
        with dspy.context(lm=BooklensLM(backend_for(server)), adapter=BooklensAdapter()):
            assert Predict(Describe)(text="x").description == "A calm day."
    assert "response_format" not in server.received[0].body


def test_a_refused_json_schema_falls_back_to_json_object_with_the_schema_for_the_rest_of_the_run():
    def llama_cpp_python(body):
        if body.get("response_format", {}).get("type") == "json_schema":
            return Reply(status=500, error=LLAMA_CPP_PYTHON_REFUSAL)
        return '{"label": "bad"}'

    with FakeOpenAIServer(responder=llama_cpp_python) as server:
        first, _ = classify(backend_for(server), text="one")
        second, _ = classify(backend_for(server), text="two")  # a new backend for the same server
    assert first.label == second.label == "bad"
    sent = formats(server)
    assert [f["type"] for f in sent] == ["json_schema", "json_object", "json_object"]
    assert sent[1]["schema"]["properties"]["label"]["enum"] == ["good", "bad"]


def test_a_server_refusing_both_dialects_gets_no_response_format_and_answers_are_still_parsed():
    def plain_only(body):
        if "response_format" in body:
            return Reply(status=400, error="response_format is not supported by this server")
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=plain_only) as server:
        prediction, _ = classify(backend_for(server))
    assert prediction.label == "good"
    assert [f and f["type"] for f in formats(server)] == ["json_schema", "json_object", None]


def test_a_forced_dialect_is_sent_as_is_and_its_refusal_is_one_line():
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server, structured="json"))
        classify(backend_for(server, structured="off"), text="y")
    assert formats(server)[0]["type"] == "json_object" and "schema" in formats(server)[0]
    assert formats(server)[1] is None

    with FakeOpenAIServer(responder=lambda body: Reply(status=500, error=LLAMA_CPP_PYTHON_REFUSAL)) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, structured="schema"))
    message = str(caught.value)
    assert "\n" not in message and "refused the 'schema' structured-output format" in message
    assert "try structured='auto'" in message and len(server.received) == 1  # a library call's words


def test_the_dialect_is_not_part_of_the_cache_key(tmp_path):
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server, structured="json"), cache_dir=tmp_path)
        # A resumed run that sends the schema in another dialect finds the finished call.
        _, lm = classify(backend_for(server, structured="schema"), cache_dir=tmp_path)
    assert len(server.received) == 1
    assert lm.usage.snapshot()["cached_calls"] == 1 and lm.usage.snapshot()["calls"] == 0


# The output schema the tests of a server's first structured answer ask under.
LABEL_SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": ["good", "bad"]}},
                "required": ["label"]}


def ask_label(lm, text):
    """One structured call through a booklens LM: its answer text."""
    answer = lm(messages=[{"role": "user", "content": f"Label: {text}"}],
                response_format={"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL_SCHEMA}})
    return answer[0]


def start_calls(calls, lm, texts):
    """`calls(lm, text)` for every text on a thread of its own, each in a copy of this context (a
    stop request follows): the started threads, and the answers and errors they leave, by text."""
    outcomes: dict = {}

    def run(text):
        try:
            outcomes[text] = calls(lm, text)
        except BaseException as exc:  # noqa: BLE001 - a stop request is an outcome here
            outcomes[text] = exc

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, text)) for text in texts]
    for t in threads:
        t.start()
    return threads, outcomes


def outcomes_of(calls, lm, texts):
    """`start_calls`' answers and errors, by text, once every thread has ended."""
    threads, outcomes = start_calls(calls, lm, texts)
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_a_refused_json_schema_is_sent_once_however_many_calls_are_in_flight():
    """At --concurrency 4 llama-cpp-python's server was sent `json_schema` by every call in flight
    (4 refusals, 12 requests for 8 calls): the first structured call to a server now goes alone,
    and the others wait for the dialect it settles on."""
    def llama_cpp_python(body):
        if body.get("response_format", {}).get("type") == "json_schema":
            return Reply(status=500, error=LLAMA_CPP_PYTHON_REFUSAL, hold=0.3)
        return '{"label": "bad"}'

    with FakeOpenAIServer(responder=llama_cpp_python) as server:
        lm = BooklensLM(backend_for(server))
        answers = parallel_map(lambda text: ask_label(lm, text), [f"text {i}" for i in range(8)], concurrency=4)
    assert answers == ['{"label": "bad"}'] * 8
    sent = [f["type"] for f in formats(server)]
    assert sent.count("json_schema") == 1 and sent[0] == "json_schema"
    assert sent.count("json_object") == 8 and len(server.received) == 9


def test_the_first_structured_call_goes_alone_and_the_rest_run_together():
    """A server that takes `json_schema` gets the first structured call alone; once it answered,
    the calls run --concurrency at a time again (each request here waits for a second one in flight)."""
    lock = threading.Lock()
    arrived: list = []
    in_flight_at_first: list = []
    first_answered = threading.Event()
    together = threading.Event()

    def respond(body):
        with lock:
            arrived.append(body)
            first = len(arrived) == 1
        if first:
            time.sleep(0.3)  # room for the other calls in flight to arrive, were they sent
            in_flight_at_first.append(server.in_flight)
            first_answered.set()
        else:
            first_answered.wait(timeout=30)  # a call sent beside the first is still in flight then
            if server.in_flight >= 2:
                together.set()
            together.wait(timeout=30)
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        lm = BooklensLM(backend_for(server))
        answers = parallel_map(lambda text: ask_label(lm, text), [f"text {i}" for i in range(8)], concurrency=4)
    assert answers == ['{"label": "good"}'] * 8
    assert in_flight_at_first == [1], (in_flight_at_first, server.max_in_flight)
    assert server.max_in_flight > 1 and together.is_set()
    assert [f["type"] for f in formats(server)] == ["json_schema"] * 8


def test_json_calls_without_a_schema_do_not_wait_for_a_turn():
    """A structured call whose output has no schema to state (an open-ended mapping) is sent as
    `json_object` in every dialect, so its answer settles nothing: it neither takes the first turn
    nor waits for one. Before, each took the turn in its own turn, and such calls went one at a time."""
    together = threading.Event()

    def respond(body):
        if server.in_flight >= 2:
            together.set()
        together.wait(timeout=10)  # held until a second call is in flight beside it
        return '{"anything": 1}'

    def ask_mapping(lm, text):
        return lm(messages=[{"role": "user", "content": f"Map: {text}"}], response_format={"type": "json_object"})[0]

    with FakeOpenAIServer(responder=respond) as server:
        lm = BooklensLM(backend_for(server))
        answers = parallel_map(lambda text: ask_mapping(lm, text), [f"text {i}" for i in range(4)], concurrency=4)
    assert answers == ['{"anything": 1}'] * 4
    assert together.is_set() and server.max_in_flight > 1, server.max_in_flight
    assert [f["type"] for f in formats(server)] == ["json_object"] * 4


def test_calls_waiting_for_a_first_call_that_fails_go_on_with_one_of_them_first():
    """A first structured call that fails for another reason (a 400 here) hands its turn on: one
    waiting call goes alone next, the others after its answer, and none is left waiting."""
    lock = threading.Lock()
    arrived: list = []
    in_flight_at_second: list = []
    second_answered = threading.Event()

    def respond(body):
        with lock:
            arrived.append(body)
            n = len(arrived)
        if n == 1:
            return Reply(status=400, error="the prompt holds a token this model cannot read", hold=0.3)
        if n == 2:
            time.sleep(0.3)
            in_flight_at_second.append(server.in_flight)
            second_answered.set()
        second_answered.wait(timeout=30)  # a call sent beside the second is still in flight then
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        outcomes = outcomes_of(ask_label, BooklensLM(backend_for(server)), ["a", "b", "c", "d"])
    errors = [o for o in outcomes.values() if isinstance(o, BaseException)]
    assert len(outcomes) == 4 and len(errors) == 1 and isinstance(errors[0], LMError)
    assert "rejected the request" in str(errors[0])
    assert sorted(o for o in outcomes.values() if isinstance(o, str)) == ['{"label": "good"}'] * 3
    assert in_flight_at_second == [1] and len(server.received) == 4, (in_flight_at_second, server.max_in_flight)


def test_calls_waiting_for_the_first_answer_stop_on_ctrl_c_and_cached_calls_do_not_wait(tmp_path):
    from booklens.lm.remote import forget_learned

    gate = threading.Event()

    def respond(body):
        if "held" in str(body["messages"]):
            gate.wait(timeout=30)
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        cache = CallCache(tmp_path / "calls.sqlite")
        assert ask_label(BooklensLM(backend_for(server), cache=cache), "cached") == '{"label": "good"}'
        forget_learned()  # a new run: the server's dialect is not known yet
        lm = BooklensLM(backend_for(server), cache=cache)
        stop = threading.Event()
        with stoppable(stop):
            first = threading.Thread(target=contextvars.copy_context().run, args=(ask_label, lm, "held"))
            first.start()
            deadline = time.monotonic() + 30
            while len(server.received) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            # Answered from the cache while the first call is out: no wait.
            assert outcomes_of(ask_label, lm, ["cached"]) == {"cached": '{"label": "good"}'}
            waiting, outcomes = start_calls(ask_label, lm, ["b", "c", "d"])
            time.sleep(0.3)  # room for them to be sent, were they not waiting
            stop.set()  # Ctrl-C
            for t in waiting:
                t.join(timeout=30)
            sent_while_held = len(server.received)
        gate.set()
        first.join(timeout=30)
    assert sent_while_held == 2
    assert all(isinstance(o, Stopped) for o in outcomes.values()) and len(outcomes) == 3
    assert len(server.received) == 2


def test_json_mode_and_free_text_of_the_same_messages_are_cached_apart(tmp_path):
    """A call in JSON mode without a schema (an open-ended mapping's output, or a library caller's
    `response_format={"type": "json_object"}`) keyed the cache as free text of the same messages does:
    the free-text answer came back for it, and JSON mode was never sent. OpenAI's `{"type": "text"}`,
    which asks for free text, went out as JSON mode."""
    ask = [{"role": "user", "content": "Describe the keeper."}]

    def respond(body):
        return '{"keeper": "Mara"}' if body.get("response_format") else "Mara keeps the light."

    with FakeOpenAIServer(responder=respond) as server:
        lm = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        assert lm(messages=ask) == ["Mara keeps the light."]
        assert lm(messages=ask, response_format={"type": "json_object"}) == ['{"keeper": "Mara"}']
        assert lm(messages=ask, response_format={"type": "text"}) == ["Mara keeps the light."]
        assert formats(server) == [None, {"type": "json_object"}]
        # Identical calls, by a new LM over the same cache (a rerun), send nothing.
        again = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        assert again(messages=ask, response_format={"type": "json_object"}) == ['{"keeper": "Mara"}']
        assert again(messages=ask) == ["Mara keeps the light."]
    assert len(server.received) == 2 and again.usage.snapshot()["cached_calls"] == 2


def test_sampling_settings_a_caller_gives_reach_the_server_and_key_the_cache(tmp_path):
    """`stop`, `top_p` and the penalties given to a booklens LM (a library caller's config, as DSPy's own
    LM sends them) were neither sent nor in the cache key: the call was answered as if they had not
    been given, from the cache entry of the call without them."""
    ask = [{"role": "user", "content": "Name the keeper, then the ship."}]

    def respond(body):
        return "Mara" if body.get("stop") else "Mara\nThe Pellmark"

    with FakeOpenAIServer(responder=respond) as server:
        lm = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        assert lm(messages=ask) == ["Mara\nThe Pellmark"]
        assert lm(messages=ask, stop=["\n"]) == ["Mara"]
        lm(messages=ask, top_p=0.5, presence_penalty=0.25, frequency_penalty=0.5)
        assert [{k: r.body.get(k) for k in ("stop", "top_p", "presence_penalty", "frequency_penalty")}
                for r in server.received] == [
            {"stop": None, "top_p": None, "presence_penalty": None, "frequency_penalty": None},
            {"stop": ["\n"], "top_p": None, "presence_penalty": None, "frequency_penalty": None},
            {"stop": None, "top_p": 0.5, "presence_penalty": 0.25, "frequency_penalty": 0.5}]
        # The same calls again (a rerun) are answered from the cache.
        again = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        assert again(messages=ask, stop=["\n"]) == ["Mara"]
        again(messages=ask, top_p=0.5, presence_penalty=0.25, frequency_penalty=0.5)
    assert len(server.received) == 3 and again.usage.snapshot()["cached_calls"] == 2


def test_structured_mode_and_limits_are_checked_where_the_lm_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOKLENS_STRUCTURED", "grammar")
    with pytest.raises(LMError, match="unknown structured-output mode 'grammar'"):
        make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    monkeypatch.setenv("BOOKLENS_STRUCTURED", "json")
    monkeypatch.setenv("BOOKLENS_RPM", "30")
    monkeypatch.setenv("BOOKLENS_TPM", "40000")
    lm = make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    assert lm.backend.structured == "json"
    assert (lm.backend.limiter.rpm, lm.backend.limiter.tpm) == (30, 40000)
    lm = make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path, structured="off", rpm=5, tpm=None)
    assert lm.backend.structured == "off" and lm.backend.limiter.rpm == 5
    monkeypatch.setenv("BOOKLENS_RPM", "many")
    with pytest.raises(LMError, match="BOOKLENS_RPM must be a whole number"):
        make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    # A bound names where the value came from: the variable, or the option that overrides it.
    monkeypatch.setenv("BOOKLENS_RPM", "0")
    with pytest.raises(LMError, match=r"^BOOKLENS_RPM must be at least 1 \(got 0\)$"):
        make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    with pytest.raises(LMError, match=r"^tpm must be at least 1 \(got 0\)$"):
        make_lm("openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path, rpm=5, tpm=0)


def test_an_api_base_that_is_not_an_http_url_is_one_line_before_any_call(tmp_path, monkeypatch):
    """Without a scheme LiteLLM's client retries a connection error for about 40 s; the URL is
    checked where the LM is made, the option and BOOKLENS_API_BASE alike."""
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    for bad in ("127.0.0.1:35035/v1", "not-a-url", "localhost:8000/v1", "ftp://host/v1", "http://", "http://h:x/v1"):
        with pytest.raises(LMError, match=r"^--api-base needs an http:// or https:// URL such as "):
            make_lm("openai/x", api_base=bad, cache_dir=tmp_path)
        with pytest.raises(LMError, match=r"^--api-base needs an http"):
            make_lm("local", api_base=bad, cache_dir=tmp_path)
    monkeypatch.setenv("BOOKLENS_API_BASE", "127.0.0.1:35035/v1")
    with pytest.raises(LMError, match=r"^BOOKLENS_API_BASE needs an http:// or https:// URL .*'127\.0\.0\.1:35035/v1'"):
        make_lm("openai/x", cache_dir=tmp_path)
    lm = make_lm("openai/x", api_base=" HTTPS://host.example/v1/ ", cache_dir=tmp_path)  # the option wins
    assert lm.backend.api_base == "https://host.example/v1"  # one server, one URL (its cache keys hold it)


def test_a_server_named_by_the_providers_variable_is_the_lms_server(tmp_path, monkeypatch):
    """LiteLLM sends `openai/...` to OPENAI_BASE_URL when no --api-base is given: that server is
    in the call cache key (two servers' answers never mix), gets cache_prompt and is recorded."""
    from booklens.lm.remote import resolve_server

    for variable in ("BOOKLENS_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "placeholder")
    with FakeOpenAIServer(responder=lambda body: "from A") as a, FakeOpenAIServer(responder=lambda body: "from B") as b:
        monkeypatch.setenv("OPENAI_BASE_URL", a.url)
        first = make_lm("openai/fake", cache_dir=tmp_path)
        assert first.backend.api_base == a.url == resolve_server("openai/fake")  # `judges` finds it the same way
        assert first.forward(prompt="Who keeps the light?").choices[0].message.content == "from A"
        monkeypatch.setenv("OPENAI_BASE_URL", b.url)
        second = make_lm("openai/fake", cache_dir=tmp_path)
        assert second.forward(prompt="Who keeps the light?").choices[0].message.content == "from B"
        assert len(a.served) == 1 and len(b.served) == 1 and b.served[0].get("cache_prompt") is True
        lm = make_lm("openai/fake", api_base=a.url, cache_dir=tmp_path)  # the option wins
        assert lm.forward(prompt="Who keeps the light?").choices[0].message.content == "from A"
        assert len(a.served) == 1  # the same server and request as the first call: from the cache
    monkeypatch.setenv("OPENAI_BASE_URL", "127.0.0.1:8000/v1")
    with pytest.raises(LMError, match=r"^OPENAI_BASE_URL needs an http:// or https:// URL"):
        make_lm("openai/x", cache_dir=tmp_path)
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", "http://127.0.0.1:9/v1")
    assert make_lm("hosted_vllm/x", cache_dir=tmp_path).backend.api_base == "http://127.0.0.1:9/v1"


# ---------------------------------------------------------------------------
# Faults


def failing_first(n, reply, then='{"label": "good"}'):
    left = {"n": n}
    lock = threading.Lock()

    def respond(body):
        with lock:
            if left["n"]:
                left["n"] -= 1
                return reply
        return then

    return respond


def test_429_waits_as_long_as_retry_after_says():
    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(1, Reply(status=429, error="slow down",
                                                           headers={"Retry-After": "7"}))) as server:
        prediction, _ = classify(backend_for(server, sleep=sleep))
    assert prediction.label == "good"
    assert sleep.delays == [7.0]
    assert len(server.received) == 2 and len(server.served) == 1


@pytest.mark.parametrize("fault", [Reply(status=429, error="rate limited"), Reply(status=503, error="overloaded"),
                                   Reply(drop=True)], ids=["429", "503", "connection-reset"])
def test_transient_faults_back_off_exponentially_with_jitter(fault):
    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(3, fault)) as server:
        prediction, _ = classify(backend_for(server, sleep=sleep, backoff_base=0.5))
    assert prediction.label == "good"
    assert len(server.received) == 4 and len(server.served) == 1
    assert len(sleep.delays) == 3
    for k, delay in enumerate(sleep.delays):
        assert 0.5 * 2**k <= delay <= 0.5 * 2**k * 1.25


def test_timeouts_are_retried():
    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(2, Reply(hold=30, content='{"label": "bad"}'))) as server:
        prediction, _ = classify(backend_for(server, sleep=sleep, timeout=0.5))
    assert prediction.label == "good"
    assert len(server.received) == 3 and len(sleep.delays) == 2


def test_a_fault_that_persists_stops_after_bounded_tries_with_one_line():
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(status=503, error="overloaded")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, sleep=sleep, backoff_base=4.0, max_backoff=10.0))
    message = str(caught.value)
    assert "\n" not in message and "kept failing after 6 tries" in message and "overloaded" in message
    assert len(server.received) == 6 and len(sleep.delays) == 5
    assert max(sleep.delays) <= 10.0 * 1.25  # the backoff is bounded


def test_a_quota_used_up_is_one_line_at_once_not_retried_as_a_rate_limit():
    """OpenAI answers a key without credit with a 429 whose code is 'insufficient_quota', which no wait
    mends: it was retried five times over about half a minute before the same words came out. (Gemini
    says the same words about a per-minute limit, without that code: a rate limit, still waited out.)"""
    said = ("You exceeded your current quota, please check your plan and billing details. For more "
            "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.")
    for model in ("openai/fake-model", "hosted_vllm/fake-model"):  # LiteLLM words the two routes' errors apart
        sleep = Recorder()
        with FakeOpenAIServer(responder=lambda body: Reply(status=429, error=said,
                                                           error_code="insufficient_quota")) as server:
            with pytest.raises(LMError) as caught:
                classify(backend_for(server, model=model, sleep=sleep))
        assert str(caught.value).startswith(f"'{model}' at {server.url} refused the request: the quota of its API "
                                            "key is used up (")
        assert said in str(caught.value) and str(caught.value).endswith("): check the plan and billing of the key")
        assert len(server.received) == 1 and sleep.delays == []
    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(1, Reply(status=429, error=said))) as server:
        prediction, _ = classify(backend_for(server, sleep=sleep))
    assert prediction.label == "good" and len(sleep.delays) == 1


def test_a_model_that_takes_only_its_default_temperature_is_sent_none():
    """OpenAI's reasoning models (o1, o3, gpt-5) refuse any temperature but 1, LiteLLM before sending
    and a proxy's server after: every call was 'rejected', so booklens could not use them at all.
    Such a model is sent no temperature from then on (other models at the same server still are)."""
    said = ("Unsupported value: 'temperature' does not support 0.0 with this model. Only the default (1) "
            "value is supported.")

    def respond(body):
        if body["model"] == "strict" and "temperature" in body:
            return Reply(status=400, error=said)
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        for model in ("openai/o3-mini", "openai/gpt-5-mini"):  # refused by LiteLLM, before any request
            prediction, _ = classify(backend_for(server, model=model))
            assert prediction.label == "good"
        assert [("temperature" in r.body) for r in server.received] == [False, False]
        strict = backend_for(server, model="openai/strict")
        for text in ("one", "two"):
            assert classify(strict, text=text)[0].label == "good"
        classify(backend_for(server, model="openai/lenient"))
    assert [(r.body["model"], r.body.get("temperature")) for r in server.received[2:]] == [
        ("strict", 0.0), ("strict", None), ("strict", None), ("lenient", 0.0)]


def test_a_retry_after_longer_than_a_run_should_wait_stops_with_one_line():
    with FakeOpenAIServer(responder=lambda body: Reply(status=429, error="quota", headers={"Retry-After": "86400"})) as server:
        with pytest.raises(LMError, match=r"asks to wait 86400 s .*rerun later") as caught:
            classify(backend_for(server))
    assert len(server.received) == 1 and "\n" not in str(caught.value)


def test_nothing_listening_is_one_line_at_once():
    sleep = Recorder()
    backend = LiteLLMBackend("openai/fake-model", api_base=f"http://127.0.0.1:{free_port()}/v1", sleep=sleep)
    with pytest.raises(LMError) as caught:
        classify(backend)
    assert "connection refused" in str(caught.value) and "is api_base right?" in str(caught.value)  # its keyword
    assert sleep.delays == []  # no backoff: nothing will start listening because we wait


@pytest.mark.parametrize(("args", "shown"), [
    (["--api-base", "http://bob:s3cretpw@gpu-host:8000/v1"], "--api-base http://gpu-host:8000/v1 names a server"),
    (["--api-base", "http://gpu-host:8000/v1?token=s3cretpw"], "--api-base http://gpu-host:8000/v1?... names a server"),
    (["--lm", "openai/x", "--api-base", "ftp://bob:s3cretpw@gpu-host:8000/v1"], "(got 'ftp://gpu-host:8000/v1')"),
    (["--lm", "openai/x", "--api-base", "bob:s3cretpw@gpu-host:8000/v1"], "(got 'gpu-host:8000/v1')"),
])
def test_a_refused_server_url_is_named_without_its_password(monkeypatch, args, shown):
    """The lines refusing a server URL (not an http(s) URL; a server for the embedded model) quoted it
    as given, password (or key in its query) included."""
    from booklens.testing import run_command

    for variable in ("BOOKLENS_LM", "BOOKLENS_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    proc = run_command(["judges", *args])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert shown in proc.stderr and "s3cretpw" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
@pytest.mark.parametrize("status", [400, 404, 500])
def test_a_password_in_the_server_url_never_reaches_an_error_line(model, status):
    """The line that quotes a server's error redacted keys from the environment, but not the
    password of an --api-base URL, which a server (or proxy) may echo back with the URL it served."""
    def echo(body):
        return Reply(status=status, error=f"no route for {secret_url}/chat/completions (user bob:s3cretpw)")

    with FakeOpenAIServer(responder=echo) as server:
        secret_url = server.url.replace("http://", "http://bob:s3cretpw@")
        backend = LiteLLMBackend(model, api_base=secret_url, retries=1, sleep=Recorder())
        with pytest.raises(LMError) as caught:
            classify(backend)
    message = str(caught.value)
    assert "s3cretpw" not in message, message
    assert f"no route for {server.url}/chat/completions (user [redacted])" in message
    assert message.startswith(f"model '{model}' was not found at {server.url} " if status == 404
                              else f"'{model}' at {server.url} ")


@pytest.mark.parametrize("status", [400, 500])
def test_a_key_a_server_echoes_where_the_line_is_cut_is_redacted_whole(status, monkeypatch):
    """A server's words are cut at 300 characters, and were redacted after the cut: a key echoed across
    it left its first characters in the line."""
    key = "sk-echo-0123456789abcdefghij"
    monkeypatch.setenv("ECHO_TEST_API_KEY", key)

    def echo(body):
        return Reply(status=status, error="w" * 285 + " " + key)

    with FakeOpenAIServer(responder=echo) as server:
        backend = LiteLLMBackend("openai/fake-model", api_base=server.url, retries=1, sleep=Recorder())
        with pytest.raises(LMError) as caught:
            classify(backend)
    message = str(caught.value)
    assert key[:8] not in message and "w" * 285 + " [redacted]" in message, message


def test_a_server_at_an_ipv6_address_is_named_with_its_brackets():
    """Records and error lines name the server without user, password or query; an IPv6 host lost its
    brackets there ('http://::1:9/v1', which is no URL and cannot be told from a port)."""
    from booklens.lm.base import lm_server
    from booklens.lm.remote import public_url

    assert public_url("http://user:key@[::1]:8000/v1?token=x") == "http://[::1]:8000/v1"
    assert public_url("http://[fe80::1]/v1") == "http://[fe80::1]/v1"
    assert public_url("http://user:key@127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    backend = LiteLLMBackend("openai/fake-model", api_base="http://[::1]:9/v1", sleep=Recorder())
    assert lm_server(BooklensLM(backend)) == "http://[::1]:9/v1"
    with pytest.raises(LMError) as caught:
        classify(backend)
    assert str(caught.value).startswith("cannot connect to http://[::1]:9/v1: ")


def test_a_server_that_answered_and_then_went_away_is_retried_as_a_restart(tmp_path):
    """After the retries, the line says the connection was refused: it said
    "InternalServerError: Connection error.", LiteLLM's name for it, as if the server had failed."""
    sleep = Recorder()
    server = FakeOpenAIServer(responder=lambda body: '{"label": "good"}')
    with server:
        backend = backend_for(server, sleep=sleep)
        classify(backend, text="first", cache_dir=tmp_path)
    with pytest.raises(LMError) as caught:
        classify(backend, text="second", cache_dir=tmp_path)
    assert len(sleep.delays) == 5
    assert str(caught.value) == (f"'openai/fake-model' at {server.url} kept failing after 6 tries: connection refused "
                                 "(has the server stopped? the completed calls are cached: rerun once it is back)")
    assert len(CallCache(tmp_path / "calls.sqlite")) == 1  # the first call's answer is kept


def test_a_wrong_path_says_to_check_the_api_base():
    with FakeOpenAIServer() as server:
        backend = LiteLLMBackend("openai/fake-model", api_base=server.url[: -len("/v1")], sleep=Recorder())
        with pytest.raises(LMError, match=r"was not found at http://127\.0\.0\.1:\d+ \(check api_base"):
            classify(backend)


def test_context_overflow_is_one_line_with_the_servers_figures():
    text = ("This model's maximum context length is 512 tokens. However, you requested 741 tokens "
            "(731 in the messages, 10 in the completion). Please reduce the length of the messages or completion.")
    with FakeOpenAIServer(responder=lambda body: Reply(status=400, error=text)) as server:
        with pytest.raises(ContextWindowExceeded) as caught:
            classify(backend_for(server))
    assert str(caught.value).startswith("the prompt (731 tokens) and its answer budget (10 tokens) do not fit the "
                                        "512-token context window of 'openai/fake-model'")
    assert len(server.received) == 1


def test_a_model_the_server_does_not_serve_is_named_with_the_servers_words():
    """At a URL that ends in /v1 the path is the usual one: the name is what to check (vLLM and
    Ollama answer 404 for a model they do not serve), not the /v1 the URL already has."""
    said = "The model `nosuch` does not exist."
    with FakeOpenAIServer(responder=lambda body: Reply(status=404, error=said)) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model="openai/nosuch"))
    assert str(caught.value) == (f"model 'openai/nosuch' was not found at {server.url} ({said}): check the model "
                                 f"name; the server lists the ones it serves at {server.url}/models")
    # Ollama's own API (ollama_chat/) lives at the server's root: its /v1 is the OpenAI-compatible one.
    with FakeOpenAIServer(responder=lambda body: Reply(status=404, error="not found")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model="ollama_chat/llama3"))
    assert str(caught.value) == f"model 'ollama_chat/llama3' was not found at {server.url}: {OLLAMA_AT_V1}"
    assert server.received[0].path == "/v1/api/chat"


# As a library call words it (`api_base`); a command names its option.
OLLAMA_AT_V1 = ("ollama_chat/ speaks Ollama's own API, which is at the server's root: give api_base without /v1, "
                "such as http://127.0.0.1:11434, or use openai/llama3 for an OpenAI-compatible server (Ollama's /v1 "
                "is one)")


def test_ollama_chat_at_an_openai_compatible_url_is_one_line_at_once():
    """ollama_chat/ posts to Ollama's /api/chat, under the URL given: at an OpenAI-compatible server's /v1
    an answer there is no answer of Ollama's API (LiteLLM fails reading it as one, which looks like a
    dropped connection), so the command ended after five retries on LiteLLM's words about a
    `Message()` argument."""
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model="ollama_chat/llama3", sleep=sleep))
    assert str(caught.value) == f"'ollama_chat/llama3' at {server.url} got no answer of Ollama's API: {OLLAMA_AT_V1}"
    assert [r.path for r in server.received] == ["/v1/api/chat"] and sleep.delays == []


@pytest.mark.parametrize("provider", ["ollama", "ollama_chat"])
@pytest.mark.parametrize("slash", ["", "/"])
def test_an_ollama_route_at_a_v1_url_is_refused_before_any_call(tmp_path, provider, slash):
    """Ollama's routes post to /api/generate or /api/chat under the URL, so a URL ending in /v1 never
    reaches Ollama's API. It was told only after the first answer; on ollama/ a server answering 200
    there gave an empty answer, asked three times before the step failed as the model's fault."""
    with FakeOpenAIServer() as server:
        with pytest.raises(LMError) as caught:
            make_lm(f"{provider}/llama3", api_base=server.url + slash, cache_dir=tmp_path)
        assert server.received == []
    fix = OLLAMA_AT_V1.replace("ollama_chat/", f"{provider}/")
    # (the server named as booklens takes it: a trailing / is no part of it)
    assert str(caught.value) == (f"'{provider}/llama3' at {server.url} would get no answer of Ollama's API: {fix}")


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_an_authentication_failure(status, monkeypatch):
    """LiteLLM turns an OpenAI-compatible server's 403 into a plain APIError; both statuses are the
    README's one line, at once."""
    monkeypatch.setenv("BOOKLENS_API_KEY", "sk-wrong-0123456789")
    with FakeOpenAIServer(responder=lambda body: Reply(status=status, error="forbidden")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server))
    assert str(caught.value) == (f"authentication failed for 'openai/fake-model' at {server.url}: "
                                 "check the API key in BOOKLENS_API_KEY")
    assert len(server.received) == 1


@pytest.mark.parametrize("model, variable, advice", [
    ("openai/fake-model", None, "no API key was sent: set BOOKLENS_API_KEY (or OPENAI_API_KEY) in the environment"),
    ("hosted_vllm/fake-model", None,
     "no API key was sent: set BOOKLENS_API_KEY (or HOSTED_VLLM_API_KEY) in the environment"),
    ("openai/fake-model", "BOOKLENS_API_KEY", "check the API key in BOOKLENS_API_KEY"),
    ("openai/fake-model", "OPENAI_API_KEY", "check the API key in OPENAI_API_KEY"),
])
def test_a_server_refusing_the_key_is_told_which_variable_it_came_from(monkeypatch, model, variable, advice):
    """A server started with a key (vLLM's --api-key, llama.cpp's) refuses requests without it. The line
    said to check the key in the environment when none was there to check: booklens sent a placeholder."""
    for name in ("BOOKLENS_API_KEY", "OPENAI_API_KEY", "HOSTED_VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    if variable:
        monkeypatch.setenv(variable, "sk-wrong-0123456789")
    with FakeOpenAIServer(responder=lambda body: Reply(status=401, error="Unauthorized")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model))
    assert str(caught.value) == f"authentication failed for '{model}' at {server.url}: {advice}"
    assert len(server.received) == 1


@pytest.mark.parametrize("model, variable, key", [
    ("openai/fake-model", "BOOKLENS_API_KEY", "\u201csk-test-0123456789\u201d"),
    ("openai/fake-model", "OPENAI_API_KEY", "\u201csk-test-0123456789\u201d"),
    ("openai/fake-model", "BOOKLENS_API_KEY", "sk-test-0123456789\r"),
    ("hosted_vllm/fake-model", "BOOKLENS_API_KEY", "sk-test-0123456789\r"),
    ("openai/fake-model", "OPENAI_API_KEY", "sk-test-0123456789 "),
], ids=["curly-quotes", "curly-quotes-provider-variable", "carriage-return", "carriage-return-vllm", "trailing-space"])
def test_a_key_holding_a_character_no_header_can_carry_is_one_line_that_says_so(monkeypatch, model, variable, key):
    """A key pasted with curly quotes, a line end of a Windows file or a space cannot go into the
    Authorization header: no request leaves. It was taken for a server answering with no chat
    completion ('check api_base'), or retried five times as a 'Connection error.'; on the vLLM
    route the last line then showed the key itself, which the redaction (of the whole value, line
    end included) missed."""
    monkeypatch.delenv("BOOKLENS_API_KEY", raising=False)
    monkeypatch.setenv(variable, key)
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model, sleep=sleep))
    assert str(caught.value) == (f"cannot send a request to '{model}' at {server.url}: its API key holds a character "
                                 "that no HTTP header can carry (a quote that is not ASCII, a line break, a space at "
                                 "its end): check the key in the environment")
    assert server.received == [] and sleep.delays == []


def test_errors_never_carry_a_key_with_a_line_end_or_spaces_around_it(monkeypatch):
    from booklens.lm.remote import LiteLLMBackend

    monkeypatch.setenv("SOME_API_KEY", " sk-test-0123456789\r\n")
    backend = LiteLLMBackend("openai/x", api_base="http://127.0.0.1:9/v1")
    assert backend._redact("it said Bearer sk-test-0123456789\\r") == "it said Bearer [redacted]\\r"


def test_error_lines_carry_the_servers_words_without_litellms_class_names():
    with FakeOpenAIServer(responder=lambda body: Reply(status=400, error="temperature must be at most 2")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server))
    assert str(caught.value) == (f"'openai/fake-model' at {server.url} rejected the request: "
                                 "temperature must be at most 2")
    with FakeOpenAIServer(responder=lambda body: Reply(status=503, error="overloaded")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, retries=1))
    assert str(caught.value) == (f"'openai/fake-model' at {server.url} kept failing after 2 tries: "
                                 "ServiceUnavailableError: overloaded")


def test_error_lines_on_the_anthropic_route_carry_the_servers_words_without_litellms_advice():
    """On the anthropic/ route the line after the last try held Anthropic's error body as JSON and
    LiteLLM's advice to programmers ('. Handle with `litellm.ServiceUnavailableError`.')."""
    claude = "anthropic/claude-haiku-4-5"
    for reply, said in ((Reply(status=503, error="overloaded"), "ServiceUnavailableError: overloaded"),
                        (Reply(drop=True), "InternalServerError: Server disconnected without sending a response.")):
        with FakeOpenAIServer(responder=lambda body: reply) as server:
            backend = LiteLLMBackend(claude, api_base=server.url[: -len("/v1")], sleep=Recorder(), retries=1)
            with pytest.raises(LMError) as caught:
                classify(backend)
        assert str(caught.value) == f"'{claude}' at {server.url[: -len('/v1')]} kept failing after 2 tries: {said}"


@pytest.mark.parametrize("model", ["anthropic/claude-haiku-4-5", "ollama/llama3"])
def test_a_setting_the_provider_does_not_take_is_named_without_litellms_drop_params_advice(model):
    """LiteLLM refuses `presence_penalty` for these providers before sending anything, and its message
    ended with advice to set `litellm.drop_params=True`, which no booklens option reaches."""
    with FakeOpenAIServer(responder=lambda body: "x") as server:
        base = server.url[: -len("/v1")]
        lm = BooklensLM(LiteLLMBackend(model, api_base=base, sleep=Recorder(), retries=0))
        with pytest.raises(LMError) as caught:
            lm(messages=[{"role": "user", "content": "hi"}], presence_penalty=0.25)
    provider, name = model.split("/", 1)
    assert str(caught.value) == (f"'{model}' at {base} rejected the request: {provider} does not support "
                                 f"parameters: ['presence_penalty'], for model={name}")
    assert server.received == []


def test_a_page_instead_of_a_completion_from_a_server_that_never_answered_is_one_line_at_once():
    """A URL where another service lives (a web page, a health check) answers 200 with no chat
    completion: retrying would only repeat it for half a minute. Once the server has answered, the
    same is taken for a glitch of a proxy and retried."""
    page = "<html><body>Welcome</body></html>"
    with FakeOpenAIServer(responder=lambda body: Reply(raw=page)) as server:
        sleep = Recorder()
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, sleep=sleep))
    message = str(caught.value)
    assert message.startswith(f"{server.url} answered, but not with an OpenAI-compatible chat completion (")
    assert "Welcome" in message and message.endswith("check api_base, usually the server's URL ending in /v1")
    assert len(server.received) == 1 and sleep.delays == []

    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(1, '{"label": "good"}', then=Reply(raw=page))) as server:
        classify(backend_for(server, sleep=sleep), text="first")
        with pytest.raises(LMError, match="kept failing after 3 tries"):
            classify(backend_for(server, sleep=sleep, retries=2), text="second")
    assert len(sleep.delays) == 2


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
@pytest.mark.parametrize("body", ["<html><body>Bad gateway</body></html>", '{"id": "x", "choices": [{"index": 0, "mes'],
                         ids=["page", "cut-json"])
def test_a_body_that_is_no_completion_after_an_answer_is_retried_on_every_route(model, body):
    """After the server has answered, a body that is no chat completion (a proxy's page, JSON cut off
    in transit) is a glitch and retried. On the hosted_vllm/ route it stopped the run at once
    ('failed: APIError: Unable to get json response ...'), where the openai/ route retried it."""
    sleep = Recorder()
    with FakeOpenAIServer(responder=failing_first(1, '{"label": "good"}', then=Reply(raw=body))) as server:
        backend = backend_for(server, model=model, sleep=sleep, retries=2)
        classify(backend, text="first")
        server.responder = failing_first(1, Reply(raw=body))
        assert classify(backend, text="second")[0].label == "good"
        assert len(sleep.delays) == 1
        server.responder = lambda request: Reply(raw=body)
        with pytest.raises(LMError, match="kept failing after 3 tries"):
            classify(backend, text="third")
    assert len(sleep.delays) == 3


def test_a_body_that_is_not_json_is_named_without_python_reprs():
    """The openai/ route's line for a body that is not JSON ended in LiteLLM's reprs of the client's
    objects ('Received response - <APIResponse [200 OK] type=<class ...>>, Type of response - <class
    ...>'), which say nothing to a user; the parser's words are kept."""
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(raw="{not json", raw_type="application/json")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, sleep=sleep))
    message = str(caught.value)
    assert message.startswith(f"{server.url} answered, but not with an OpenAI-compatible chat completion (")
    assert "Expecting property name enclosed in double quotes" in message
    assert "<class" not in message and "APIResponse" not in message and "Type of response" not in message
    with FakeOpenAIServer(responder=failing_first(1, '{"label": "good"}',
                                                  then=Reply(raw="{not json", raw_type="application/json"))) as server:
        backend = backend_for(server, sleep=sleep, retries=1)
        classify(backend, text="first")
        with pytest.raises(LMError) as caught:
            classify(backend, text="second")
    message = str(caught.value)
    assert "kept failing after 2 tries" in message and "Expecting property name" in message
    assert "<class" not in message and "APIResponse" not in message and "\n" not in message


NO_CHOICES = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model", "choices": [],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}})


def test_a_response_without_choices_is_retried_as_a_glitch_once_the_server_has_answered():
    """A proxy that loses its upstream's answer may send a response with no choices. From a server
    that never answered, it is one line at once, as a page instead of a completion is; after an
    answer, it stopped the whole run at once, where a retry mends it."""
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(raw=NO_CHOICES)) as server:
        with pytest.raises(LMError, match=r"answered without a completion \(no choices in its response\)$"):
            classify(backend_for(server, sleep=sleep))
    assert len(server.received) == 1 and sleep.delays == []
    with FakeOpenAIServer(responder=failing_first(1, '{"label": "good"}', then=Reply(raw=NO_CHOICES))) as server:
        backend = backend_for(server, sleep=sleep, retries=2)
        classify(backend, text="first")
        respond = failing_first(1, Reply(raw=NO_CHOICES))
        server.responder = respond
        assert classify(backend, text="second")[0].label == "good"
        assert len(sleep.delays) == 1
        server.responder = lambda body: Reply(raw=NO_CHOICES)
        with pytest.raises(LMError, match=r"kept answering without a completion \(no choices in its response\) "
                                          r"after 3 tries$"):
            classify(backend, text="third")
    assert len(sleep.delays) == 3


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_a_response_whose_choices_are_null_is_one_without_choices(model):
    """`"choices": null` is a response without choices too. On the hosted_vllm/ route it was retried
    for half a minute from a server that never answered, and the openai/ route named it in LiteLLM's
    words; both now say what a response with an empty list of choices gets."""
    null = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model", "choices": None})
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(raw=null, raw_type="application/json")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model, sleep=sleep))
    assert str(caught.value) == f"'{model}' at {server.url} answered without a completion (no choices in its response)"
    assert len(server.received) == 1 and sleep.delays == []
    with FakeOpenAIServer(responder=failing_first(1, '{"label": "good"}', then=Reply(raw=null))) as server:
        backend = backend_for(server, model=model, sleep=sleep, retries=2)
        classify(backend, text="first")
        with pytest.raises(LMError, match=r"kept answering without a completion \(no choices in its response\) "
                                          r"after 3 tries$"):
            classify(backend, text="second")
    assert len(sleep.delays) == 2


@pytest.mark.parametrize("said, expected", [
    # llama.cpp's C++ server (its message has carried the figures since 2025)
    ("request (5012 tokens) exceeds the available context size (4096 tokens), try increasing it",
     "the prompt (5012 tokens) does not fit the 4096-token context window"),
    # vLLM, a prompt too large by itself
    ("This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens. "
     "Please reduce the length of the input messages.",
     "the prompt (3000 tokens) does not fit the 2048-token context window"),
    # vLLM, a prompt that fits with no room for the answer budget
    ("'max_tokens' or 'max_completion_tokens' is too large: 1024. This model's maximum context length is 2048 "
     "tokens and your request has 1500 input tokens (1024 > 2048 - 1500).",
     "the prompt (1500 tokens) and its answer budget (1024 tokens) do not fit the 2048-token context window"),
    # older vLLM, from its engine's input check
    ("The decoder prompt (length 12324) is longer than the maximum model length of 8192. Make sure that "
     "`max_model_len` is no smaller than the number of text tokens.",
     "the prompt (12324 tokens) does not fit the 8192-token context window"),
    ("The prompt (total length 25938) is too long to fit into the model (context length 4096). Make sure that "
     "`max_model_len` is no smaller than the number of text tokens plus multimodal tokens.",
     "the prompt (25938 tokens) does not fit the 4096-token context window"),
    # LM Studio 0.3 (its spelling), LM Studio 0.3.2x and 0.4, its MLX engine
    ("Trying to keep the first 10136 tokens when context the overflows. However, the model is loaded with context "
     "length of only 7866 tokens, which is not enough. Try to load the model with a larger context length, or "
     "provide a shorter input",
     "the prompt (10136 tokens) does not fit the 7866-token context window"),
    ("The number of tokens to keep from the initial prompt is greater than the context length (n_keep: 13055>= "
     "n_ctx: 4096). Try to load the model with a larger context length, or provide a shorter input.",
     "the prompt (13055 tokens) does not fit the 4096-token context window"),
    ("The number of tokens to keep from the initial prompt is greater than the context length. Try to load the "
     "model with a larger context length, or provide a shorter input",
     "the prompt is larger than the context window of 'openai/fake-model' (The number of tokens to keep"),
    ("Context size has been exceeded.", "the prompt is larger than the context window of 'openai/fake-model'"),
    # llama.cpp's server before it counted the request, as LM Studio passes it on
    ("Cannot truncate prompt with n_keep (15028) >= n_ctx (7424)",
     "the prompt (15028 tokens) does not fit the 7424-token context window"),
    # Text Generation Inference (422)
    ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens "
     "and 500 `max_new_tokens`",
     "the prompt (4000 tokens) and its answer budget (500 tokens) do not fit the 4096-token context window"),
    ("Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",
     "the prompt (5000 tokens) does not fit the 4096-token context window"),
    # Ollama told not to truncate (`truncate`/`shift` false), and its embedding models
    ("the prompt is longer than the context length currently available to the model",
     "the prompt is larger than the context window of 'openai/fake-model'"),
    ("the input length exceeds the context length", "the prompt is larger than the context window"),
    # words without figures: the server's own, without LiteLLM's class names
    ("the request exceeds the available context size, try increasing it",
     "the prompt is larger than the context window of 'openai/fake-model' (the request exceeds the available "
     "context size, try increasing it)"),
])
def test_context_overflow_in_other_servers_words_is_one_line_with_their_figures(said, expected):
    """The same line whatever the server's words, its error an object or (LM Studio's, TGI's) a string,
    on either OpenAI-compatible route; never retried, but for a prompt that fits with room for an
    answer, sent again once with the budget the figures leave."""
    import re

    figures = re.search(r"prompt \((\d+) tokens\).* the (\d+)-token context window", expected)
    room = int(figures.group(2)) - int(figures.group(1)) if figures else None
    for reply in (Reply(status=400, error=said),
                  Reply(status=400, raw=json.dumps({"error": said}), raw_type="application/json")):
        for model in ("openai/fake-model", "hosted_vllm/fake-model"):
            with FakeOpenAIServer(responder=lambda body: reply) as server:
                with pytest.raises(ContextWindowExceeded) as caught:
                    classify(backend_for(server, model=model))
            assert str(caught.value).startswith(expected.replace("openai/fake-model", model)), str(caught.value)
            assert str(caught.value).endswith(": use smaller inputs, or a model or server with a larger context")
            sent = [r.body["max_tokens"] for r in server.received]
            assert "\n" not in str(caught.value)
            assert sent == ([sent[0], room] if room is not None and 16 <= room < sent[0] else [sent[0]]), sent


def test_a_url_with_a_query_is_refused_where_litellm_would_put_the_path_inside_it(tmp_path, monkeypatch):
    """LiteLLM's OpenAI-compatible (and most other) routes add '/chat/completions' to the URL as
    text, so with a query every request goes to the bare path: refused before any call, without
    showing the query (it may hold a key). Azure's routes merge the query (`?api-version=`) into the
    request, and take it; their error lines leave it out too."""
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        for model in ("openai/fake-model", "hosted_vllm/fake-model", "ollama_chat/fake-model"):
            with pytest.raises(LMError) as caught:
                make_lm(model, api_base=f"{server.url}?token=s3cret-token", cache_dir=tmp_path)
            assert str(caught.value) == (
                f"the server URL {server.url}?... has a query string or fragment, which '{model}' cannot take: "
                "LiteLLM adds the endpoint's path after the URL, so it would land inside the query; give the "
                "server's base URL, such as http://127.0.0.1:8000/v1")
        assert server.received == []
    port = free_port()
    monkeypatch.setenv("AZURE_API_VERSION", "2024-10-21")
    backend = LiteLLMBackend("azure/deployment", api_base=f"http://127.0.0.1:{port}/openai?code=s3cret-code",
                             sleep=Recorder())
    backend.validate()
    with pytest.raises(LMError) as caught:
        classify(backend)
    assert str(caught.value).startswith(f"cannot connect to http://127.0.0.1:{port}/openai: connection refused")


def test_a_model_name_without_its_provider_beside_a_server_is_told_how_to_name_it(tmp_path, monkeypatch):
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    with pytest.raises(LMError, match=r"^unknown model 'llama3': name the provider of the server at "
                                      r"http://127\.0\.0\.1:9/v1, e\.g\. openai/llama3 for an OpenAI-compatible one$"):
        make_lm("llama3", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)
    with pytest.raises(LMError, match=r"^unknown model 'openai/': use 'local' or a LiteLLM model string"):
        make_lm("openai/", api_base="http://127.0.0.1:9/v1", cache_dir=tmp_path)


def test_blank_lm_and_structured_variables_are_unset(monkeypatch):
    """An empty BOOKLENS_LM is one not set (the embedded model), and so is one of spaces (it was an
    unknown model named ''); likewise BOOKLENS_STRUCTURED."""
    from booklens.lm import resolve_lm_name, resolve_structured

    for blank in ("", "   "):
        monkeypatch.setenv("BOOKLENS_LM", blank)
        monkeypatch.setenv("BOOKLENS_STRUCTURED", blank)
        assert resolve_lm_name(None) == "local" and resolve_structured(None) == "auto"
    monkeypatch.setenv("BOOKLENS_LM", " openai/x ")
    monkeypatch.setenv("BOOKLENS_STRUCTURED", " JSON ")
    assert resolve_lm_name(None) == "openai/x" and resolve_structured(None) == "json"


def test_an_answer_whose_content_is_null_is_re_asked_and_not_kept(tmp_path):
    """`content: null` (a model that answered with nothing, a filtered answer) is an empty answer:
    not kept, and re-asked as one that does not parse; then recorded as failed, never read as None."""
    with FakeOpenAIServer(responder=failing_first(1, Reply(content=None))) as server:
        backend = backend_for(server)
        lm = BooklensLM(backend, cache=CallCache(tmp_path / "calls.sqlite"))
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            got = predict_with_retries(Predict(Classify), text="x")
    assert got.ok and got.prediction.label == "good" and got.attempts == 2
    assert len(lm.call_cache) == 1  # the answer of the second try only
    with FakeOpenAIServer(responder=lambda body: Reply(content=None)) as server:
        with dspy.context(lm=BooklensLM(backend_for(server)), adapter=BooklensAdapter()):
            got = predict_with_retries(Predict(Classify), text="x")
    assert not got.ok and got.error == "unparseable answer: the answer is empty" and len(server.received) == 3


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_reasoning_whose_opening_tag_was_in_the_prompt_is_not_taken_for_the_answer(model):
    """DeepSeek-R1's distills and QwQ have their chat template open the reasoning (`<think>` ends the
    prompt), so a server that does not split it off (vLLM without --reasoning-parser) answers
    'reasoning</think>answer'. LiteLLM drops only a block that opens in the answer: the reasoning
    was kept as the start of a summary (or of any prose answer)."""
    reasoning = "Okay, the user wants a summary. The keeper... wait, the fuel.\n</think>\n\n"
    answers = {"plain": reasoning + "The keeper gave away the fuel.", "json": reasoning + '{"label": "bad"}',
               "whole": "<think>\nLet me see.\n</think>\n\nThe lamp went dark."}
    with FakeOpenAIServer(responder=lambda body: answers[body["messages"][-1]["content"]]) as server:
        lm = BooklensLM(backend_for(server, model=model))
        assert lm(messages=[{"role": "user", "content": "plain"}]) == ["The keeper gave away the fuel."]
        assert lm(messages=[{"role": "user", "content": "whole"}])[0].strip() == "The lamp went dark."  # LiteLLM's
        with FakeOpenAIServer(responder=lambda body: answers["json"]) as json_server:
            with dspy.context(lm=BooklensLM(backend_for(json_server, model=model)), adapter=BooklensAdapter()):
                got = predict_with_retries(Predict(Classify), text="x")
    assert got.ok and got.prediction.label == "bad" and got.attempts == 1


def test_running_out_of_memory_is_not_taken_for_an_unreadable_answer():
    """A MemoryError inside a call is the machine's, not the answer's: it ends the call where it
    happened instead of being recorded as 'unparseable answer: MemoryError' and asked twice more."""
    calls = []

    def predictor(**inputs):
        calls.append(inputs)
        raise MemoryError()

    with dspy.context(lm=BooklensLM(LiteLLMBackend("openai/fake-model", api_base="http://127.0.0.1:9/v1"))), pytest.raises(MemoryError):
        predict_with_retries(predictor, text="x")
    assert len(calls) == 1


def test_an_answer_cut_off_at_the_token_limit_is_re_asked_with_a_larger_budget():
    def needs_40_tokens(body):
        if body["max_tokens"] < 40:
            return Reply(content='{"label": "go', finish_reason="length")
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=needs_40_tokens) as server:
        lm = BooklensLM(backend_for(server))
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), config={"max_tokens": 10, "temperature": 0.0}, text="x")
    assert result.ok and result.prediction.label == "good" and result.attempts == 3
    assert [r.body["max_tokens"] for r in server.received] == [10, 20, 40]
    assert all(r.body["temperature"] == 0.0 for r in server.received)  # more room, not another answer


def test_an_answer_always_cut_off_is_recorded_as_failed_after_the_cap():
    with FakeOpenAIServer(responder=lambda body: Reply(content='{"label": "go', finish_reason="length")) as server:
        lm = BooklensLM(backend_for(server))
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), tries=4, config={"max_tokens": 16}, text="x")
    assert not result.ok and result.attempts == 4
    assert "cut off at the token limit (64 tokens)" in result.error
    assert [r.body["max_tokens"] for r in server.received] == [16, 32, 64, 64]  # 4x the first budget at most


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_an_answer_that_is_reasoning_only_says_so_and_keeps_the_reasoning_out(model):
    """A server that splits a model's thinking off (vLLM's reasoning parser, some providers) sends an
    answer whose budget went on thinking as empty content with `reasoning_content`: the re-asks grow
    the budget as for any cut-off answer, and the failure says what came back and what to change,
    not that the answer is empty."""
    def thinks_all_along(body):
        return Reply(content="", reasoning="Let me weigh the label. " * 40, finish_reason="length",
                     completion_tokens=body["max_tokens"])

    with FakeOpenAIServer(responder=thinks_all_along) as server:
        with dspy.context(lm=BooklensLM(backend_for(server, model=model)), adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), config={"max_tokens": 16}, text="x")
    assert [r.body["max_tokens"] for r in server.received] == [16, 32, 64]
    assert (result.ok, result.attempts) == (False, 3)
    assert result.error == ("the answer was cut off at the token limit (64 tokens): unparseable answer: the model sent "
                            "only reasoning (64 tokens), no answer: turn its thinking off or use a non-reasoning model")

    # Reasoning beside an answer is no part of it.
    with FakeOpenAIServer(responder=lambda body: Reply(content='{"label": "bad"}', reasoning="Hmm, good?")) as server:
        with dspy.context(lm=BooklensLM(backend_for(server, model=model)), adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), text="x")
    assert result.ok and result.prediction.label == "bad" and result.attempts == 1


class CutByTheWindow:
    """A backend whose context window leaves 42 tokens for the answer, as the embedded model's does
    near its end: it writes that far whatever max_tokens says (`Completion.answer_room`)."""

    name = "window"

    def __init__(self, settle_on: int | None = None):
        self.requests: list[dict] = []
        self.settle_on = settle_on  # the try that gets a short answer

    def complete(self, request):
        from booklens.lm.base import Completion

        self.requests.append(request)
        if len(self.requests) == self.settle_on:
            return Completion(text='{"label": "good"}', prompt_tokens=8150, completion_tokens=5)
        return Completion(text='{"label": "go', finish_reason="length", prompt_tokens=8150, completion_tokens=42,
                          answer_room=42)


def test_an_answer_the_context_window_cut_off_is_re_asked_fresh_not_with_a_larger_budget():
    """Doubling the budget of an answer the window ended brings the same answer back (the embedded
    model gave the same cut answer at 2x and 4x the budget): the next try is a fresh sample instead,
    and the error names the window."""
    backend = CutByTheWindow(settle_on=2)
    with dspy.context(lm=BooklensLM(backend), adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), config={"max_tokens": 100}, text="x")
    assert result.ok and result.attempts == 2
    assert [r["max_tokens"] for r in backend.requests] == [100, 100]
    assert backend.requests[1]["temperature"] == 0.7  # a cut-off answer's re-ask keeps the first's

    backend = CutByTheWindow()
    with dspy.context(lm=BooklensLM(backend), adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), tries=3, config={"max_tokens": 100}, text="x")
    assert not result.ok and result.attempts == 3 and [r["max_tokens"] for r in backend.requests] == [100] * 3
    assert result.error.startswith("the answer was cut off where the context window ends (42 tokens left after "
                                   "the prompt): ")


def test_answers_rejected_in_every_try_leave_the_cache_so_a_rerun_asks_again(tmp_path):
    """A judge that failed to parse three times is not replayed from the cache once the server is
    fixed; an item a later try settled keeps its rejected first answer, so its rerun is free."""
    answers = {"first": ["not a label"] * 3, "second": ["not a label", '{"label": "good"}']}

    def responder(call):
        text = call.inputs["text"]
        script = answers[text]
        return script[min(call.attempt, len(script) - 1)]

    lm = ScriptedLM(responder, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        failed = predict_with_retries(Predict(Classify), tries=3, text="first")
        settled = predict_with_retries(Predict(Classify), tries=3, text="second")
    assert not failed.ok and failed.attempts == 3 and "unparseable answer" in failed.error
    assert settled.ok and settled.attempts == 2
    assert len(lm.backend.calls) == 5 and len(lm.call_cache) == 2  # the settled item's two answers

    answers["first"] = ['{"label": "bad"}']  # the server is fixed
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        again = predict_with_retries(Predict(Classify), tries=3, text="first")
        replayed = predict_with_retries(Predict(Classify), tries=3, text="second")
    assert again.ok and again.prediction.label == "bad" and again.attempts == 1
    assert replayed.ok and replayed.prediction.label == "good" and replayed.attempts == 2
    assert len(lm.backend.calls) == 6  # one new call: the failed item asked again, the settled one replayed


def test_booklens_timeout_sets_how_long_a_request_may_take(monkeypatch):
    monkeypatch.setenv("BOOKLENS_TIMEOUT", "0.5")
    with FakeOpenAIServer(latency=5.0) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, retries=1))
        assert len(server.received) == 2  # the first try and one retry, each given up after 0.5 s
    # One account of the wait, not LiteLLM's twice ("Request timed out. Error_str: Request timed out."); a
    # request waiting in the queue of a server with fewer slots than `concurrency` times out as well.
    assert str(caught.value) == (f"'openai/fake-model' at {server.url} kept failing after 2 tries: no answer within "
                                 "0.5 s (BOOKLENS_TIMEOUT sets how long; the time a request waits in the queue of a "
                                 "server with fewer parallel slots than concurrency counts)")
    for bad in ("0", "-3", "soon", "inf"):
        monkeypatch.setenv("BOOKLENS_TIMEOUT", bad)
        with pytest.raises(LMError, match=f"^BOOKLENS_TIMEOUT must be a number of seconds above 0, not '{bad}'$"):
            LiteLLMBackend("openai/fake-model", api_base="http://127.0.0.1:9/v1")
    monkeypatch.delenv("BOOKLENS_TIMEOUT")
    assert LiteLLMBackend("openai/fake-model", api_base="http://127.0.0.1:9/v1").timeout == 600.0


def test_a_timeout_longer_than_the_clocks_hold_is_refused_before_any_call(monkeypatch):
    """BOOKLENS_TIMEOUT=1e30 (or 1e10) passed the check, then every request failed in the client before it
    left (the seconds overflow the clock below it), reported as a dropped connection and retried for
    half a minute: 'kept failing after 6 tries: Connection error.' A billion seconds still waits."""
    monkeypatch.setenv("BOOKLENS_TIMEOUT", "1e9")
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        prediction, _ = classify(backend_for(server))
        assert prediction.label == "good" and len(server.received) == 1
    for huge in ("1e10", "1e30"):
        monkeypatch.setenv("BOOKLENS_TIMEOUT", huge)
        with pytest.raises(LMError) as caught:
            LiteLLMBackend("openai/fake-model", api_base="http://127.0.0.1:9/v1")
        assert str(caught.value) == (f"BOOKLENS_TIMEOUT must be at most 1000000000 seconds (about 31 years; the "
                                     f"clocks a request is timed by count no further), not '{huge}'")
    with pytest.raises(LMError, match=r"^timeout must be at most 1000000000 seconds"):
        LiteLLMBackend("openai/fake-model", api_base="http://127.0.0.1:9/v1", timeout=1e30)


def test_errors_never_carry_a_key_a_server_echoes(monkeypatch):
    canary = "sk-booklens-canary-7f3a9c21"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    with FakeOpenAIServer(responder=lambda body: Reply(status=400, error=f"bad request from key {canary}")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server))
    assert server.received[0].headers.get("Authorization") == f"Bearer {canary}"  # the key was in use
    assert canary not in str(caught.value) and "[redacted]" in str(caught.value)


# ---------------------------------------------------------------------------
# Identical concurrent calls run once


def test_identical_concurrent_calls_make_one_backend_call(tmp_path):
    release = threading.Event()

    def gated(body):
        release.wait(timeout=60)
        return '{"label": "good"}'

    threads_n = 4
    with FakeOpenAIServer(responder=gated) as server:
        lm = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        results: list = []

        def ask():
            with dspy.context(lm=lm, adapter=BooklensAdapter()):
                results.append(Predict(Classify)(text="same").label)

        threads = [threading.Thread(target=ask) for _ in range(threads_n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while lm.call_cache.waiting() < threads_n - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = lm.call_cache.waiting()
        release.set()
        for t in threads:
            t.join(timeout=60)
    assert waiting == threads_n - 1
    assert len(server.received) == 1
    assert results == ["good"] * threads_n
    usage = lm.usage.snapshot()
    assert usage["calls"] == 1 and usage["cached_calls"] == threads_n - 1


def test_waiters_get_the_error_of_the_call_they_waited_for(tmp_path):
    release = threading.Event()

    def gated_refusal(body):
        release.wait(timeout=60)
        return Reply(status=401, error="invalid api key")

    with FakeOpenAIServer(responder=gated_refusal) as server:
        lm = BooklensLM(backend_for(server), cache=CallCache(tmp_path / "calls.sqlite"))
        errors: list = []

        def ask():
            with dspy.context(lm=lm, adapter=BooklensAdapter()):
                try:
                    Predict(Classify)(text="same")
                except LMError as exc:
                    errors.append(str(exc))

        threads = [threading.Thread(target=ask) for _ in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while lm.call_cache.waiting() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join(timeout=60)
    assert len(server.received) == 1
    assert len(errors) == 3 and all("authentication failed" in e for e in errors)


# ---------------------------------------------------------------------------
# Rate limits


class FakeClock:
    """Minutes of rate limits without waiting: sleeping moves this clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def most_in_any_minute(times: list[float]) -> int:
    return max(sum(1 for u in times if t - 60 < u <= t) for t in times)


def test_requests_per_minute_are_shared_by_all_threads():
    clock = FakeClock()
    resume = threading.Event()
    asked: list[float] = []

    def held(seconds):  # a held call waits until the test has moved the clock a minute on
        asked.append(seconds)
        resume.wait(timeout=60)

    limiter = RateLimiter(rpm=2, clock=clock, sleep=held)
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        lm = BooklensLM(backend_for(server, limiter=limiter))

        def ask(i):
            with dspy.context(lm=lm, adapter=BooklensAdapter()):
                Predict(Classify)(text=f"text {i}")

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while (len(server.served) < 2 or not asked) and time.monotonic() < deadline:
            time.sleep(0.01)
        served_in_first_minute = len(server.served)
        clock.sleep(63)
        resume.set()
        for t in threads:
            t.join(timeout=60)
    assert served_in_first_minute == 2
    # until the first request leaves the window: a minute and the margin between a slot and the send
    assert len(asked) == 1 and 61 < asked[0] <= 62.1
    assert len(server.served) == 3


def test_the_limits_hold_for_every_model_one_server_is_sent(tmp_path):
    """--rpm caps the requests a server is sent. The limiters were per model and server, so two models
    on one server (a sweep's systems and judge on one vLLM or Ollama) were sent twice --rpm a minute."""
    from booklens.lm.pool import LMPool, rate_limit_key

    clock = FakeClock()

    made: list[str] = []

    def limiter_for(key):  # a limiter of its own for every call: the pool must ask once per server
        made.append(key)
        return RateLimiter(rpm=2, clock=clock, sleep=clock.sleep)

    arrivals: dict[str, list[float]] = {"one": [], "other": []}

    def at(name):
        def respond(body):
            arrivals[name].append(clock())
            return '{"label": "good"}'
        return respond

    with FakeOpenAIServer(responder=at("one")) as one, FakeOpenAIServer(responder=at("other")) as other:
        pool = LMPool("openai/a", one.url, cache_dir=tmp_path, use_cache=False, limiter_for=limiter_for)
        lms = [pool.get(), pool.get("hosted_vllm/b"), pool.get("openai/c"), pool.get("openai/a", other.url)]
        for i in range(2):
            for lm in lms:
                with dspy.context(lm=lm, adapter=BooklensAdapter()):
                    Predict(Classify)(text=f"text {i}")
        # the pool's own limiters (from rpm) are one per server too
        own = LMPool("openai/a", one.url, cache_dir=tmp_path, use_cache=False, rpm=5)
        limiters = [own.get().backend.limiter, own.get("openai/c").backend.limiter,
                    own.get("openai/a", other.url).backend.limiter]
    assert len(arrivals["one"]) == 6 and len(arrivals["other"]) == 2
    assert most_in_any_minute(arrivals["one"]) == 2
    assert arrivals["one"][:2] == [0.0, 0.0] and arrivals["one"][2] >= 62
    assert made == [one.url, other.url]  # another server's limit is its own
    # without a server, the provider's own endpoint is the server, whatever its model
    assert rate_limit_key("openai/gpt-4o-mini", None) == rate_limit_key("gpt-4o", None) == "openai/"
    assert rate_limit_key("anthropic/claude-haiku-4-5", None) == "anthropic/"
    assert limiters[0] is limiters[1] and limiters[0] is not limiters[2] and limiters[0].rpm == 5


def test_tokens_per_minute_count_the_prompt_and_the_answer_budget():
    clock = FakeClock()
    limiter = RateLimiter(tpm=5000, clock=clock, sleep=clock.sleep)
    arrivals: list[float] = []

    def respond(body):
        arrivals.append(clock())
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        backend = backend_for(server, limiter=limiter)
        for i in range(5):
            classify(backend, text=f"text {i}", max_tokens=2000)  # a short prompt + 2000: two fit in 5000
    assert len(server.served) == 5
    assert most_in_any_minute(arrivals) == 2
    assert arrivals[:2] == [0.0, 0.0] and arrivals[2] >= 62


def test_both_limits_together_never_let_more_than_either_through_in_a_minute():
    """A request took its slot in the requests' window, then waited for the tokens' window: it left a
    minute after its slot, with later requests whose slots came then, so with --rpm 2 --tpm 1000 the
    server saw three requests at one moment. Both limits are checked and counted at the same moment."""
    clock = FakeClock()
    limiter = RateLimiter(rpm=2, tpm=1000, clock=clock, sleep=clock.sleep)
    sent: list[float] = []
    for tokens in (900, 900, 50, 50, 50, 50):
        limiter.acquire(tokens)
        sent.append(clock())
    assert most_in_any_minute(sent) <= 2
    assert sent[:2] == [0.0, 62.001]  # the second waits for the first's tokens, not for a request slot


def test_one_request_larger_than_the_token_limit_still_goes():
    clock = FakeClock()
    limiter = RateLimiter(tpm=100, clock=clock, sleep=clock.sleep)
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server, limiter=limiter), max_tokens=500)
    assert len(server.served) == 1 and limiter.waits == []


def test_a_large_token_limit_counts_in_bounded_memory_and_still_keeps_to_the_limit():
    """pyrate-limiter's bucket holds one entry per unit of weight, and a request weighed one unit per
    token: under --tpm 10**8 one request of 10**7 tokens made a list of ten million entries, and a huge
    answer budget beside a huge --tpm filled memory before anything was sent. A large limit is counted
    in coarser units, each request rounded up, so no minute lets more through than the limit."""
    import tracemalloc

    clock = FakeClock()
    limiter = RateLimiter(tpm=10**8, clock=clock, sleep=clock.sleep)
    tracemalloc.start()
    try:
        limiter.acquire(10**7)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 10**6  # bytes: the entries of ten million tokens took 80 MB
    huge = RateLimiter(tpm=10**30, clock=clock, sleep=clock.sleep)
    for _ in range(100):
        huge.acquire(10**28)  # a hundred such requests fit a minute of 10**30 tokens
    assert huge.waits == []
    clock.now = 0.0
    limiter = RateLimiter(tpm=3 * 10**6, clock=clock, sleep=clock.sleep)
    sent = []
    for tokens in (999_999, 999_999, 999_999, 3, 1):
        limiter.acquire(tokens)
        sent.append(clock())
    # 3,000,000 tokens fit the minute; one more would pass the limit
    assert sent[:4] == [0.0, 0.0, 0.0, 0.0] and sent[4] >= 62


# ---------------------------------------------------------------------------
# Prompt caching: reported, priced, and asked for on the wire


def test_provider_cached_prompt_tokens_are_reported_and_priced_at_the_cached_rate():
    import litellm

    reply = Reply(content='{"label": "good"}', prompt_tokens=1000, completion_tokens=10, cached_tokens=800)
    with FakeOpenAIServer(responder=lambda body: reply) as server:
        _, lm = classify(backend_for(server, model="openai/gpt-4o-mini"))
    usage = lm.usage.snapshot()
    assert usage["provider_cached_tokens"] == 800 and usage["prompt_tokens"] == 1000
    # Priced as OpenAI's own endpoint would bill it (a loopback server under its name has no price).
    response = litellm.ModelResponse(model="gpt-4o-mini", usage={
        "prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
        "prompt_tokens_details": {"cached_tokens": 800}},
        choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}])
    usage = dict(usage, cost_usd=LiteLLMBackend("openai/gpt-4o-mini")._completion(response).cost)
    price = litellm.model_cost["gpt-4o-mini"]
    expected = (200 * price["input_cost_per_token"] + 800 * price["cache_read_input_token_cost"]
                + 10 * price["output_cost_per_token"])
    assert usage["cost_usd"] == pytest.approx(expected, rel=1e-6)
    assert usage["cost_usd"] < 1000 * price["input_cost_per_token"] + 10 * price["output_cost_per_token"]


def test_a_model_served_elsewhere_under_a_listed_name_has_no_price():
    """vLLM serving a model as 'openai/gpt-4o' at --api-base was priced at OpenAI's list price: the
    cost of a self-hosted run is unknown, not the list price; the provider's own endpoint stays priced."""
    reply = Reply(content='{"label": "good"}', prompt_tokens=1000, completion_tokens=10)
    with FakeOpenAIServer(responder=lambda body: reply) as server:
        _, lm = classify(backend_for(server, model="openai/gpt-4o"))
    usage = lm.usage.snapshot()
    assert usage["calls"] == 1 and usage["prompt_tokens"] == 1000
    assert usage["cost_usd"] is None and usage["unpriced_calls"] == 1
    assert LiteLLMBackend("openai/gpt-4o").list_priced and not backend_for(server, model="openai/gpt-4o").list_priced


@pytest.mark.parametrize("model, api_base, priced", [
    ("openai/gpt-4o", "https://api.openai.com/v1", True),    # OpenAI's own URL spelled out: its list price
    ("openai/gpt-4o", "https://API.OpenAI.com/v1/", True),
    ("anthropic/claude-3-5-haiku-20241022", "https://api.anthropic.com", True),
    ("openai/gpt-4o", "https://api.openai.com.example.net/v1", False),  # another host whose name starts so
    ("openai/gpt-4o", "https://gateway.example.com/v1", False),
    ("anthropic/claude-3-5-haiku-20241022", "https://api.openai.com/v1", False),  # not the provider's own host
    ("hosted_vllm/qwen", "http://10.0.0.5:8000/v1", True),
])
def test_the_providers_own_url_given_as_api_base_keeps_its_list_price(model, api_base, priced):
    """OpenAI's own URL given as --api-base (as a config may spell it out) made a run's cost unknown."""
    assert LiteLLMBackend(model, api_base=api_base).list_priced is priced


def test_a_server_that_sends_no_usage_has_its_tokens_counted_and_no_price(tmp_path):
    """Usage left out of the answer (some proxies and small servers) was recorded as 0 prompt and 0
    completion tokens, as if known: the tokens are counted with LiteLLM's tokenizer, and the cost is
    unknown rather than $0, even for a model LiteLLM has prices for."""
    import litellm

    answer = '{"label": "good"}'
    with FakeOpenAIServer(responder=lambda body: Reply(content=answer, usage=False)) as server:
        _, lm = classify(backend_for(server, model="openai/gpt-4o-mini"), text="A calm sea under a grey sky.",
                         cache_dir=tmp_path)
        # A rerun replays the same figures from the cache.
        _, again = classify(backend_for(server, model="openai/gpt-4o-mini"), text="A calm sea under a grey sky.",
                            cache_dir=tmp_path)
    usage = lm.usage.snapshot()
    messages = server.received[0].body["messages"]
    assert usage["prompt_tokens"] == litellm.token_counter(model="openai/gpt-4o-mini", messages=messages) > 50
    assert usage["completion_tokens"] == litellm.token_counter(model="openai/gpt-4o-mini", text=answer) > 0
    assert usage["cost_usd"] is None and usage["unpriced_calls"] == 1
    assert len(server.received) == 1 and again.usage.snapshot()["cached_prompt_tokens"] == usage["prompt_tokens"]


def test_a_model_litellm_prices_at_zero_costs_zero_not_unknown():
    """A known price of $0 (LiteLLM's for Ollama's models) is $0, as the sweep's estimate has it; it
    was turned into 'unknown'."""
    import litellm

    from booklens.sweep.estimate import price

    response = litellm.ModelResponse(model="llama3", usage={"prompt_tokens": 10, "completion_tokens": 2,
                                                            "total_tokens": 12},
                                     choices=[{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "Yes."}}])
    response._hidden_params["custom_llm_provider"] = "ollama"
    completion = LiteLLMBackend("ollama/llama3", api_base="http://127.0.0.1:9")._completion(response)
    assert completion.cost == 0.0 == price("ollama/llama3", 10, 2)
    assert (completion.prompt_tokens, completion.completion_tokens) == (10, 2)


def test_a_dspy_rollout_reaches_the_server_as_a_seed_of_its_own():
    from booklens.lm.base import sample_seed

    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        lm = BooklensLM(backend_for(server))
        for rollout in (None, 1, 2):
            with dspy.context(lm=lm.copy(rollout_id=rollout, temperature=1.0), adapter=BooklensAdapter()):
                Predict(Classify)(text="same")
    seeds = [r.body.get("seed") for r in server.received]
    assert seeds == [0, sample_seed({"rollout": 1}), sample_seed({"rollout": 2})] and len(set(seeds)) == 3


def test_llama_cpp_servers_get_cache_prompt_and_a_server_refusing_it_stops_getting_it():
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server))
    assert server.received[0].body["cache_prompt"] is True

    def strict(body):
        if "cache_prompt" in body:
            return Reply(status=400, error="Unrecognized request argument supplied: cache_prompt")
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=strict) as server:
        backend = backend_for(server)
        classify(backend, text="one")
        classify(backend, text="two")
    assert ["cache_prompt" in r.body for r in server.received] == [True, False, False]

    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server, model="hosted_vllm/some-model"))  # vLLM caches prefixes by itself
    assert "cache_prompt" not in server.received[0].body


def test_explicit_prompt_caching_providers_get_cache_markers_on_the_shared_prefix():
    demo = dspy.Example(text="a sunny day", label="good")
    reply = Reply(content='{"label": "good"}', prompt_tokens=300, completion_tokens=5, cached_tokens=2000)
    with FakeOpenAIServer(responder=lambda body: reply) as server:
        backend = LiteLLMBackend("anthropic/claude-haiku-4-5", api_base=server.url[: -len("/v1")], sleep=Recorder())
        lm = BooklensLM(backend)
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            predictor = Predict(Classify)
            predictor.demos = [demo]
            prediction = predictor(text="a grey day")
    assert prediction.label == "good"
    request = server.received[0]
    assert request.path == "/v1/messages"
    body = request.body
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    # system, demo question, demo answer, question: the demo answer closes the shared prefix.
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][-2]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert not any("cache_control" in block for block in body["messages"][-1]["content"])
    assert "cache_prompt" not in body
    assert lm.usage.snapshot()["provider_cached_tokens"] == 2000


def test_providers_without_explicit_caching_get_no_markers():
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server, model="openai/gpt-4o-mini"))
    assert "cache_control" not in json.dumps(server.received[0].body)


# ---------------------------------------------------------------------------
# Keys stay in the environment


def answer_every_step(body):
    """Plausible answers for summarize, coherence, claims and verification (extra fields are ignored)."""
    if "as plain text" in str(body["messages"][-1]["content"]):
        return "Mara keeps the Pellmark light. A storm stops her supplies. Tobin brings oil for the winter."
    return json.dumps({"verdict": "no confusion", "questions": [], "error_types": [],
                       "claims": ["Mara keeps the Pellmark light.", "Tobin brings oil for the winter."],
                       "label": "faithful", "supporting_passages": [1], "refuting_passages": [],
                       "reason": "Passage 1 says so."})


def test_a_key_in_the_environment_reaches_no_file_and_no_output(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    canary = "sk-booklens-canary-5d1e0b7a44c9"
    story = Path(__file__).resolve().parents[1] / "examples" / "sample_story.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOKLENS_")}
    env.update(OPENAI_API_KEY=canary, BOOKLENS_CACHE_DIR=str(tmp_path / "cache"))
    with FakeOpenAIServer(responder=answer_every_step) as server:
        ok = subprocess.run([sys.executable, "-m", "booklens", "run", str(story), "--lm", "openai/fake-model",
                             "--api-base", server.url, "--chunk-size", "1024", "--max-summary-tokens", "200",
                             "--evidence", "bm25", "-o", str(tmp_path / "run")],
                            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert {r.headers.get("Authorization") for r in server.received} == {f"Bearer {canary}"}  # it was used

    def echo_the_key(body):
        return Reply(status=400, error=f"request from key {canary} was malformed")

    with FakeOpenAIServer(responder=echo_the_key) as server:
        failed = subprocess.run([sys.executable, "-m", "booklens", "claims", str(story), "--lm", "openai/fake-model",
                                 "--api-base", server.url, "-o", str(tmp_path / "claims.json")],
                                capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert failed.returncode != 0 and failed.stderr.strip().startswith("error:")

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "calls.sqlite" for p in written) and (tmp_path / "run" / "report.html").exists()
    for path in written:
        assert canary.encode() not in path.read_bytes(), path
    for stream in (ok.stdout, ok.stderr, failed.stdout, failed.stderr):
        assert canary not in stream


# ---------------------------------------------------------------------------
# The command line


def _ollama_commands(d, url):
    """Every kind of command that takes --lm/--api-base, with inputs it would accept (`d`: a folder)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    story = repo / "examples" / "sample_story.txt"
    (d / "summary.txt").write_text("Mara keeps the Pellmark light.", encoding="utf-8")
    (d / "claims.json").write_text(json.dumps(["Mara keeps the light."]), encoding="utf-8")
    (d / "m.yaml").write_text(f"books: [{story}]\nsystems: [{{name: a}}]\n", encoding="utf-8")
    (d / "own.yaml").write_text(f"books: [{story}]\nsystems: [{{name: a, lm: openai/x, api_base: 'http://127.0.0.1:9/v1'}}]"
                                f"\njudge: {{lm: ollama/llama3, api_base: '{url}'}}\n", encoding="utf-8")
    lm = ["--lm", "ollama/llama3", "--api-base", url]
    return {
        "summarize": ["summarize", story, *lm],
        "score": ["score", d / "summary.txt", *lm],
        "claims": ["claims", d / "summary.txt", *lm],
        "verify": ["verify", "--claims", d / "claims.json", "--book", story, *lm],
        "check": ["check", story, d / "summary.txt", *lm],
        "run": ["run", story, "-o", d / "run", *lm],
        "qa": ["qa", story, "--questions", repo / "examples" / "qa" / "the_cask_of_amontillado.json", *lm],
        "diverse": ["diverse", repo / "examples" / "diverse" / "harbor_bridge_closure.json", *lm],
        "sweep": ["sweep", d / "m.yaml", "-o", d / "sweep", *lm],
        "sweep-dry-run": ["sweep", d / "m.yaml", "-o", d / "sweep", *lm, "--dry-run"],
        "manifest-step": ["sweep", d / "own.yaml", "-o", d / "sweep"],
        "manifest-step-dry-run": ["sweep", d / "own.yaml", "-o", d / "sweep", "--dry-run"],
    }


@pytest.mark.parametrize("command", ["summarize", "score", "claims", "verify", "check", "run", "qa", "diverse",
                                     "sweep", "sweep-dry-run", "manifest-step", "manifest-step-dry-run"])
def test_every_command_refuses_an_ollama_route_at_a_v1_url_before_any_call(tmp_path, monkeypatch, command):
    """The refusal is made where the LM is made, so every command and a manifest's own steps (the dry run
    too, which needs no key) say it in one line, and nothing reaches the server."""
    from booklens.testing import run_command

    for name in ("BOOKLENS_LM", "BOOKLENS_API_BASE", "BOOKLENS_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    with FakeOpenAIServer() as server:
        proc = run_command(_ollama_commands(tmp_path, server.url)[command])
    fix = OLLAMA_AT_V1.replace("ollama_chat/", "ollama/").replace("give api_base", "give --api-base")  # a command's
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: 'ollama/llama3' at {server.url} would get no answer of Ollama's API: "
                                        f"{fix}"]
    assert server.received == []
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "run").exists()


def test_structured_option_reaches_the_wire(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from booklens.cli import app

    summary = tmp_path / "summary.txt"
    summary.write_text("Mara keeps the Pellmark light. Tobin brings oil for the winter.", encoding="utf-8")
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    sent = {}
    for mode in ("json", "off"):
        with FakeOpenAIServer(responder=answer_every_step) as server:
            result = CliRunner().invoke(app, ["claims", str(summary), "--lm", "openai/fake-model", "--api-base",
                                              server.url, "--structured", mode, "--rpm", "600", "--tpm", "100000",
                                              "-o", str(tmp_path / f"{mode}.json")], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        sent[mode] = server.received[0].body.get("response_format")
    assert sent["json"]["type"] == "json_object" and "claims" in sent["json"]["schema"]["properties"]
    assert sent["off"] is None


def test_a_wrong_api_base_is_one_line_through_the_command(tmp_path):
    import os
    import subprocess
    import sys

    summary = tmp_path / "summary.txt"
    summary.write_text("Mara keeps the Pellmark light.", encoding="utf-8")
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "booklens", "claims", str(summary), "--lm", "openai/fake-model",
                           "--api-base", url], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot connect to {url}: connection refused (is the server running, and is --api-base right?)"]


# ---------------------------------------------------------------------------
# Self-hosted servers in their own words


class FakeOllama:
    """Ollama's own API on loopback: `POST /api/chat` (ollama_chat/) and `/api/generate` (ollama/),
    answered with `answer` (or with a 500 carrying `error`, as Ollama sends a model it cannot load);
    `received` keeps each request's path and body."""

    def __init__(self, answer: str = '{"label": "good"}', *, pulled: bool = True, error: str | None = None):
        import http.server
        import socketserver

        self.received: list[tuple[str, dict]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fake.received.append((self.path, body))
                done = {"model": body.get("model"), "created_at": "2026-01-01T00:00:00Z", "done": True,
                        "done_reason": "stop", "prompt_eval_count": 10, "eval_count": 5}
                if error is not None:
                    data = json.dumps({"error": error}).encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if not pulled and self.path in ("/api/chat", "/api/generate"):
                    payload = None  # Ollama's words for a model it has not pulled
                    missing = {"error": f"model '{body.get('model')}' not found, try pulling it first"}
                elif self.path == "/api/chat":
                    payload = {**done, "message": {"role": "assistant", "content": answer}}
                elif self.path == "/api/generate":
                    payload = {**done, "response": answer}
                else:
                    payload = None
                data = json.dumps(payload or (missing if not pulled else {"error": "404 page not found"})).encode()
                self.send_response(200 if payload else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        answer = answer
        self._httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    def __enter__(self) -> "FakeOllama":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.mark.parametrize("model, path, windows", [
    ("ollama_chat/llama3", "/api/chat", [8192, 8192, 16384, 16384]),
    ("ollama/llama3", "/api/generate", [8192, 8192, 16384, 16384]),
    ("ollama_chat/codellama", "/api/chat", [4096, 4096, 16384, 16384]),  # LiteLLM knows its 4K window
    # a 32K window is not taken whole for short prompts: Ollama would hold that much memory for them
    ("ollama_chat/mistral-7B-Instruct-v0.2", "/api/chat", [8192, 8192, 16384, 16384]),
    ("ollama_chat/my-own-model", "/api/chat", [8192, 8192, 16384, 16384]),
])
def test_ollama_is_sent_the_context_window_booklens_plans_for(model, path, windows):
    """Ollama cuts a prompt longer than its `num_ctx` (2048 or 4096 by default) from the front, without
    an error: a long judge prompt lost its instructions and the answers were garbage. Every request
    carries the window booklens plans for (booklens' 8192 default, or the model's known window where
    that is smaller), the same value each time (Ollama reloads the model when it changes), and a larger
    one for a request that needs more (a larger --context-window, evidence for a larger known window),
    kept for the requests after it."""
    with FakeOllama() as server:
        backend = LiteLLMBackend(model, api_base=server.url, sleep=Recorder())
        assert classify(backend, text="short")[0].label == "good"
        assert classify(backend, text="another")[0].label == "good"
        classify(backend, text="a long chapter " * 2500)  # about 10K tokens
        classify(backend, text="short again")
    asked = [body for p, body in server.received if p != "/api/show"]  # LiteLLM looks the model up there
    assert [p for p, _ in server.received if p != "/api/show"] == [path] * 4
    assert [body["options"]["num_ctx"] for body in asked] == windows


def test_only_ollamas_own_api_is_sent_num_ctx():
    with FakeOpenAIServer(responder=lambda body: '{"label": "good"}') as server:
        classify(backend_for(server))
        classify(backend_for(server, model="hosted_vllm/fake-model"))
    assert all("num_ctx" not in json.dumps(r.body) for r in server.received)


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_api_base_asked_of_a_pool_is_one_not_given(tmp_path, monkeypatch, blank):
    """An empty server (an empty variable passed on, `SystemConfig(api_base="")` given to `run_book`) is
    one left out, as an empty --api-base, BOOKLENS_API_BASE or manifest `api_base` is: the pool's own server. It was taken for 'no server'
    and sent the model to its provider's public endpoint instead."""
    from booklens.lm import LMPool

    for variable in ("BOOKLENS_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    with FakeOpenAIServer(responder=lambda body: "from the pool's server") as server:
        pool = LMPool("openai/fake", server.url, cache_dir=tmp_path)
        assert pool.resolve(None, blank) == pool.resolve() == ("openai/fake", server.url)
        assert pool.resolve("openai/other", blank) == ("openai/other", server.url)
        lm = pool.get(api_base=blank)
        assert lm is pool.get() and lm.backend.api_base == server.url
        assert lm.forward(prompt="Who keeps the light?").choices[0].message.content == "from the pool's server"


def error_body(error) -> Reply:
    """An HTTP 200 whose body is an error object instead of a chat completion (some proxies, LM Studio)."""
    return Reply(raw=json.dumps({"error": error}), raw_type="application/json")


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_an_error_sent_with_status_200_is_one_line_with_the_servers_words(model):
    """LiteLLM reads the error object of a 200 but its OpenAI route drops the message: the line said
    'rejected the request: OpenAIException - ' and a context overflow was not seen as one."""
    said = "model 'fake-model' is not loaded: load it in the server first"
    with FakeOpenAIServer(responder=lambda body: error_body({"message": said, "type": "invalid_request_error"})) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model))
    assert str(caught.value) == f"'{model}' at {server.url} answered with an error instead of a chat completion: {said}"
    assert len(server.received) == 1

    overflow = ("Trying to keep the first 10136 tokens when context the overflows. However, the model is loaded with "
                "context length of only 7866 tokens, which is not enough.")
    with FakeOpenAIServer(responder=lambda body: error_body({"message": overflow})) as server:
        with pytest.raises(ContextWindowExceeded, match=r"^the prompt \(10136 tokens\) does not fit the 7866-token "):
            classify(backend_for(server, model=model))

    # An error a retry may mend (the code the body gives) is retried, and the last line keeps its words.
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: error_body({"message": "upstream timed out", "code": 503})) as server:
        with pytest.raises(LMError, match=r"kept failing after 3 tries: \w+: upstream timed out$"):
            classify(backend_for(server, model=model, sleep=sleep, retries=2))
    assert len(sleep.delays) == 2

    # A string in place of the object: LiteLLM passes no words of it on, and the line says so.
    with FakeOpenAIServer(responder=lambda body: error_body("the model crashed")) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model))
    assert str(caught.value) == (f"'{model}' at {server.url} answered with an error instead of a chat completion "
                                 "(its words are in the server's log)")


@pytest.mark.parametrize("model", ["hosted_vllm/fake-model", "ollama_chat/fake-model", "ollama/fake-model"])
def test_a_page_instead_of_an_answer_is_one_line_at_once_on_every_route(model):
    """A proxy's login page where the server should answer: on the hosted_vllm/ route the line named no
    fix, and Ollama's routes took it for a dropped connection, retried for half a minute."""
    page = "<html><body>Sign in to the proxy</body></html>"
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(raw=page)) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model, sleep=sleep))
    message = str(caught.value)
    assert message.startswith(f"{server.url} answered, but not with ") and "\n" not in message
    if model.startswith("ollama"):
        assert message.endswith("check api_base, usually the Ollama server's root, such as http://127.0.0.1:11434")
    else:
        assert "Sign in to the proxy" in message
        assert message.endswith("check api_base, usually the server's URL ending in /v1")
    assert len(server.received) == 1 and sleep.delays == []
    # A proxy's error page with a 5xx (a server restarting behind it) is still retried.
    with FakeOpenAIServer(responder=lambda body: Reply(status=502, raw="<html>502 Bad Gateway</html>")) as server:
        with pytest.raises(LMError, match=r"kept failing after 2 tries: BadGatewayError: <html>502 Bad Gateway"):
            classify(backend_for(server, model=model, sleep=sleep, retries=1))
    assert len(sleep.delays) == 1


def test_a_model_ollama_has_not_pulled_is_named_with_its_words_and_the_fix():
    """At Ollama's root a 404 is a model the server does not have: the line told to add /v1, which
    Ollama's own API does not take."""
    with FakeOllama(pulled=False) as server:
        with pytest.raises(LMError) as caught:
            classify(LiteLLMBackend("ollama_chat/llama3", api_base=server.url, sleep=Recorder()))
    assert str(caught.value) == (f"model 'ollama_chat/llama3' was not found at {server.url} (model 'llama3' not found, "
                                 "try pulling it first): check the model name (`ollama list` shows the ones the "
                                 "server has; `ollama pull llama3` fetches it) and that api_base is the Ollama server's root, such as "
                                 "http://127.0.0.1:11434")


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model", "ollama_chat/fake-model"])
def test_a_url_that_takes_no_posts_says_to_check_the_api_base(model):
    """A web server (nginx with a static site, a dashboard) answers a POST with 405: the line showed its
    page as a failure or a rejected request, without saying that the URL is what to check."""
    page = "<html><head><title>405 Not Allowed</title></head><body>nginx</body></html>"
    with FakeOpenAIServer(responder=lambda body: Reply(status=405, raw=page)) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model))
    root = ("the Ollama server's root, such as http://127.0.0.1:11434" if model.startswith("ollama")
            else "the server's URL ending in /v1")
    assert str(caught.value) == (f"{server.url} takes no requests at the path '{model}' was sent to (405 Method Not "
                                 f"Allowed): check api_base, usually {root}")
    assert len(server.received) == 1


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_a_server_that_implements_no_post_says_to_check_the_api_base(model):
    """Python's `http.server` (a folder served on a port mistaken for the model's) answers a POST with
    501 and an HTML page: the line was that page's first line, `APIError: <!DOCTYPE HTML>`."""
    page = "<!DOCTYPE HTML>\n<html><body><h1>Error response</h1><p>Error code: 501</p></body></html>"
    with FakeOpenAIServer(responder=lambda body: Reply(status=501, raw=page)) as server:
        with pytest.raises(LMError) as caught:
            classify(backend_for(server, model=model))
    assert str(caught.value) == (f"{server.url} takes no requests at the path '{model}' was sent to (501 Not "
                                 "Implemented): check api_base, usually the server's URL ending in /v1")
    assert len(server.received) == 1


def test_ollamas_window_is_counted_without_the_tokenizer_litellm_picks_by_the_models_name(monkeypatch):
    """For a model name holding 'llama-3' LiteLLM's counter fetches a tokenizer from the Hugging Face
    Hub: offline, every request would try, and log a warning, before it is sent."""
    import litellm

    asked = []
    count = litellm.token_counter
    monkeypatch.setattr(litellm, "token_counter", lambda *args, **kwargs: asked.append(kwargs.get("model")) or
                        count(*args, **kwargs))
    with FakeOllama() as server:
        classify(LiteLLMBackend("ollama_chat/llama-3-custom", api_base=server.url, sleep=Recorder()))
    assert asked and "ollama_chat/llama-3-custom" not in asked


def test_a_context_overflow_sent_with_status_200_is_one_line_through_the_command(tmp_path):
    """LM Studio 0.4 sends its overflow with HTTP 200: the command ends with the context line, not a
    traceback or a parse error."""
    import os
    import subprocess
    import sys

    summary = tmp_path / "summary.txt"
    summary.write_text("Mara keeps the Pellmark light.", encoding="utf-8")
    said = ("The number of tokens to keep from the initial prompt is greater than the context length (n_keep: 13055>= "
            "n_ctx: 4096). Try to load the model with a larger context length, or provide a shorter input.")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_DEBUG", None)
    with FakeOpenAIServer(responder=lambda body: error_body({"message": said})) as server:
        proc = subprocess.run([sys.executable, "-m", "booklens", "claims", str(summary), "--lm", "openai/fake-model",
                               "--api-base", server.url], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: the prompt (13055 tokens) does not fit the 4096-token context window of 'openai/fake-model': use "
        "smaller inputs, or a model or server with a larger context"]


def test_lm_studios_own_variable_names_the_lms_server(tmp_path, monkeypatch):
    """LiteLLM sends `lm_studio/...` to LM_STUDIO_API_BASE when no --api-base is given: that server
    is the LM's, as OPENAI_BASE_URL's is for openai/ (the call cache key, records, the error lines)."""
    from booklens.lm.remote import resolve_server

    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    with FakeOpenAIServer(responder=lambda body: "from LM Studio") as server:
        monkeypatch.setenv("LM_STUDIO_API_BASE", server.url)
        lm = make_lm("lm_studio/fake", cache_dir=tmp_path)
        assert lm.backend.api_base == server.url == resolve_server("lm_studio/fake")
        assert lm.forward(prompt="Who keeps the light?").choices[0].message.content == "from LM Studio"
    monkeypatch.setenv("LM_STUDIO_API_BASE", "127.0.0.1:1234/v1")
    with pytest.raises(LMError, match=r"^LM_STUDIO_API_BASE needs an http:// or https:// URL"):
        make_lm("lm_studio/fake", cache_dir=tmp_path)


def test_an_ollama_models_window_comes_from_litellms_table_not_a_server(monkeypatch):
    """Ollama's models find their window in LiteLLM's table (`ollama_chat/` under its `ollama/` names)
    only. LiteLLM's lookup by name asks an Ollama server (OLLAMA_API_BASE or localhost, whatever
    --api-base says) for the window the model was trained for, often 128K, and the judges would then
    fill that much evidence per claim."""
    from booklens.lm.remote import model_context_window

    with FakeOllama() as server:
        monkeypatch.setenv("OLLAMA_API_BASE", server.url)
        assert model_context_window("ollama_chat/codellama") == model_context_window("ollama/codellama") == 4096
        assert model_context_window("ollama_chat/my-own-model") is None
        assert model_context_window("ollama/my-own-model") is None
    assert server.received == []


def test_answers_ollama_gave_before_it_was_sent_its_window_are_not_replayed(tmp_path, monkeypatch):
    """An answer cached before requests carried `num_ctx` may answer a prompt Ollama cut from the front:
    a rerun asks again instead of replaying it; the new answer is then kept as any other."""
    with FakeOllama() as server:
        def asked() -> int:
            return len([p for p, _ in server.received if p != "/api/show"])

        backend = LiteLLMBackend("ollama_chat/llama3", api_base=server.url, sleep=Recorder())
        with monkeypatch.context() as before:  # the backend as it was: no identity of its own in the key
            before.setattr(LiteLLMBackend, "cache_identity", None, raising=False)
            classify(backend, cache_dir=tmp_path)
        assert asked() == 1
        classify(backend, cache_dir=tmp_path)
        assert asked() == 2
        classify(backend, cache_dir=tmp_path)
        assert asked() == 2


@pytest.mark.parametrize("usage", [True, False])
def test_the_rate_limit_and_missing_usage_are_counted_without_asking_the_hugging_face_hub(monkeypatch, usage):
    """The limiter's count (and the count of a server that sends no usage) took LiteLLM's tokenizer for
    the model's name, which for a name holding 'llama-3' is fetched from the Hugging Face Hub: offline,
    every request tried it (and warned) before it was sent. They count as the Ollama window does."""
    import huggingface_hub
    import huggingface_hub.file_download

    fetched = []

    def no_hub(*args, **kwargs):
        fetched.append(kwargs.get("repo_id") or args)
        raise OSError("the Hub is out of reach")

    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", no_hub)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    limiter = RateLimiter(rpm=600, tpm=100000)
    with FakeOpenAIServer(responder=lambda body: Reply(content='{"label": "good"}', usage=usage)) as server:
        _, lm = classify(backend_for(server, model="openai/llama-3-custom", limiter=limiter))
    assert len(server.served) == 1 and fetched == []
    assert lm.usage.snapshot()["prompt_tokens"] > 0


@pytest.mark.parametrize("model", ["ollama_chat/llama3.1:70b", "ollama/llama3.1:70b"])
@pytest.mark.parametrize("said, fix", [
    ("model requires more system memory (44.0 GiB) than is available (7.6 GiB)",
     "use a smaller model (or a smaller quantization of it)"),
    ("model 'llama3.1:70b' not found, try pulling it first", "run `ollama pull llama3.1:70b` where the server runs"),
    # How other Ollama versions say that loading the model ran out of memory
    ("llama runner process has terminated: cudaMalloc failed: out of memory",
     "use a smaller model (or a smaller quantization of it)"),
    ("llama runner process has terminated: error loading model: unable to allocate CUDA0 buffer",
     "use a smaller model (or a smaller quantization of it)"),
    ("llama-server process has terminated: exit status 1: ggml_backend_cpu_buffer_type_alloc_buffer: failed to "
     "allocate buffer of size 40000000000", "use a smaller model (or a smaller quantization of it)"),
    ("llama-server reported out-of-memory during startup: cudaMalloc failed: out of memory",
     "use a smaller model (or a smaller quantization of it)"),
    ("failed to allocate memory for model", "use a smaller model (or a smaller quantization of it)"),
    ("memory layout cannot be allocated with num_gpu = 99", "use a smaller model (or a smaller quantization of it)"),
])
def test_an_ollama_500_that_no_retry_can_mend_is_one_line_at_once(model, said, fix):
    """Ollama sends a model it cannot load with a 500, which was taken for a passing fault: the same
    request was sent 5 more times, with backoff, before the line."""
    sleep = Recorder()
    with FakeOllama(error=said) as server:
        with pytest.raises(LMError) as caught:
            classify(LiteLLMBackend(model, api_base=server.url, sleep=sleep))
    assert str(caught.value) == f"'{model}' at {server.url} cannot serve the model ({said}): {fix}"
    assert len(server.received) == 1 and sleep.delays == []


@pytest.mark.parametrize("said", [
    "llama runner process has terminated: exit status 2",  # a crash that names no cause
    "cudaMalloc failed: out of memory",  # while answering: newer Ollama then unloads its other models
])
def test_an_ollama_500_that_a_retry_may_mend_is_still_retried(said):
    """Only a model that could not be loaded for lack of memory is one line at once: a crash that names
    no cause, or memory running out while a loaded model answers, may pass."""
    sleep = Recorder()
    with FakeOllama(error=said) as server:
        backend = LiteLLMBackend("ollama_chat/llama3.1:70b", api_base=server.url, sleep=sleep)
        with pytest.raises(LMError, match="kept failing after"):
            classify(backend)
    assert len(server.received) == backend.retries + 1 and len(sleep.delays) == backend.retries


@pytest.fixture
def silent_server():
    """A host that drops connection requests, as a firewall or a powered-off machine behind a router
    does: a listening socket whose one-place queue is already taken, so a new SYN gets no answer."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    held = socket.create_connection(server.getsockname())  # fills the queue; never accepted
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    held.close()
    server.close()


def no_connection_line(model: str, server: str) -> str:
    port = server.split(":")[2].split("/")[0]
    return (f"'{model}' at {server} does not answer: no connection to 127.0.0.1:{port} within 0.3 s (is the "
            "server up, and its port open to this machine? BOOKLENS_CONNECT_TIMEOUT sets how long)")


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_a_server_that_never_answers_a_connection_fails_in_one_try(silent_server, monkeypatch, model):
    """A request to a host that drops packets waited the whole request timeout (600 s by default) and
    was tried six times: an hour before the error. The connection is tried once, for
    BOOKLENS_CONNECT_TIMEOUT, before the first request, and no request is retried."""
    monkeypatch.setenv("BOOKLENS_CONNECT_TIMEOUT", "0.3")
    sleep = Recorder()
    backend = LiteLLMBackend(model, api_base=silent_server, timeout=0.6, sleep=sleep)
    with pytest.raises(LMError) as caught:
        backend.complete({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
    assert str(caught.value) == no_connection_line(model, silent_server)
    assert sleep.delays == []  # no retry


@pytest.mark.parametrize(("variable", "model"), [
    ("OPENAI_BASE_URL", "openai/fake-model"), ("OPENAI_API_BASE", "openai/fake-model"),
    ("HOSTED_VLLM_API_BASE", "hosted_vllm/fake-model"), ("ANTHROPIC_API_BASE", "anthropic/claude-3-5-haiku-20241022"),
    ("ANTHROPIC_BASE_URL", "anthropic/claude-3-5-haiku-20241022"),
])
def test_a_server_named_only_by_the_environment_that_never_answers_fails_in_one_try(silent_server, monkeypatch,
                                                                                       variable, model):
    """LiteLLM finds the server in the provider's variable when no --api-base is given: a dead one
    named by ANTHROPIC_API_BASE or ANTHROPIC_BASE_URL cost a request timeout per try, unchecked."""
    for name in ("BOOKLENS_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, silent_server)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "placeholder")
    monkeypatch.setenv("BOOKLENS_CONNECT_TIMEOUT", "0.3")
    monkeypatch.setenv("BOOKLENS_TIMEOUT", "0.6")
    backend = make_backend(model)
    backend.sleep = sleep = Recorder()
    with pytest.raises(LMError) as caught:
        backend.complete({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
    assert str(caught.value) == no_connection_line(model, silent_server)
    assert sleep.delays == []  # no retry


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_connect_timeout_that_is_no_number_of_seconds_is_one_line(monkeypatch, value):
    from booklens.lm.remote import connect_timeout

    monkeypatch.setenv("BOOKLENS_CONNECT_TIMEOUT", value)
    with pytest.raises(LMError, match=f"^BOOKLENS_CONNECT_TIMEOUT must be a number of seconds above 0, not '{value}'$"):
        connect_timeout()


def test_behind_a_proxy_the_connection_is_left_to_the_proxy(silent_server, monkeypatch):
    """Through HTTP(S)_PROXY the client connects to the proxy, not to the server: no check of its own."""
    from booklens.lm.remote import _learned_about

    monkeypatch.setenv("BOOKLENS_CONNECT_TIMEOUT", "0.3")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    backend = LiteLLMBackend("openai/fake-model", api_base=silent_server, sleep=Recorder())
    backend._check_connects()  # no LMError: the server's own port is not tried
    assert "connects" not in _learned_about(backend.provider, silent_server)


@pytest.mark.parametrize("model", ["openai/fake-model", "hosted_vllm/fake-model"])
def test_a_server_still_loading_its_model_says_to_rerun_once_it_has(model):
    """llama.cpp's server answers 503 "Loading model" until its weights are in memory, which can take
    longer than the retries wait: the line said only that it kept failing."""
    sleep = Recorder()
    with FakeOpenAIServer(responder=lambda body: Reply(status=503, raw='{"error": {"code": 503, "message": '
                                                       '"Loading model", "type": "unavailable_error"}}',
                                                       raw_type="application/json")) as server:
        backend = LiteLLMBackend(model, api_base=server.url, sleep=sleep)
        with pytest.raises(LMError) as caught:
            backend.complete({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
    message = str(caught.value)
    assert len(server.received) == 6 and len(sleep.delays) == 5
    assert message.endswith("(the server is still loading its model: rerun once it has; the completed calls are "
                            "cached)"), message
    assert "\n" not in message


def test_an_answer_a_lenient_server_cut_at_its_window_is_re_asked_fresh_not_with_a_larger_budget():
    """llama.cpp's servers state no window and write only as far as it goes: the answer stops with
    finish reason 'length' after fewer tokens than its budget. A larger budget brings the same answer
    back, so the re-ask is a fresh sample at the same budget and the error names the window, not a
    token limit that was never reached."""
    def window_ends_after_700(body):
        return Reply(content='{"label": "go', finish_reason="length", completion_tokens=min(700, body["max_tokens"]))

    with FakeOpenAIServer(responder=window_ends_after_700) as server:
        with dspy.context(lm=BooklensLM(backend_for(server)), adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), config={"max_tokens": 1024}, text="x")
    assert [r.body["max_tokens"] for r in server.received] == [1024, 1024, 1024]
    assert (result.ok, result.attempts) == (False, 3)
    assert result.error.startswith("the answer was cut off where the context window ends (700 tokens left after "
                                   "the prompt): ")


# llama-server (b1-0c1e570) started with `-c 2048` and its default 4 slots sharing one 2048-token context:
# what it sent to each of the requests in flight when together they filled it, verbatim.
SHARED_CONTEXT_FULL = Reply(status=500, raw='{"error": {"code": 500, "message": "Context size has been exceeded.", '
                                             '"type": "server_error"}}', raw_type="application/json")


def test_a_llama_cpp_server_whose_shared_context_filled_up_is_sent_one_request_at_a_time():
    """llama.cpp's C++ server gives its slots one shared context and states the whole of it as each
    slot's window. Requests that fit it alone but not together all failed with a 500 'Context size has
    been exceeded.', which was taken for a prompt larger than the window: the run stopped. Now the call
    is sent again, and from then on the server gets one request at a time."""
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def shared_context(body):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            first = len(server.received) == 1
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        return SHARED_CONTEXT_FULL if first else '{"label": "good"}'

    with FakeOpenAIServer(responder=shared_context) as server:
        backend = backend_for(server)
        prediction, _ = classify(backend, text="first")
        assert prediction.label == "good" and len(server.received) == 2
        assert backend.sleep.delays == []  # sent again at once: the failure freed the context
        threads = [threading.Thread(target=classify, args=(backend,), kwargs={"text": f"t{i}"}) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(server.received) == 6 and most[0] == 1


def test_a_shared_context_full_for_a_request_alone_is_retried_not_taken_for_a_prompt_too_large():
    """Another command's requests fill the shared context too, so a request sent alone may still fail
    so (two commands at one llama-server each stopped with the context line): retried as a 5xx is,
    then one line that names the shared context, never the line of a prompt too large."""
    with FakeOpenAIServer(responder=lambda body: SHARED_CONTEXT_FULL) as server:
        backend = backend_for(server)
        with pytest.raises(LMError) as caught:
            classify(backend)
    assert len(server.received) == 7 and len(backend.sleep.delays) == 5  # the first at once, then 6 tries
    message = str(caught.value)
    assert not isinstance(caught.value, ContextWindowExceeded)
    assert message == (f"'openai/fake-model' at {server.url} kept failing after 6 tries: InternalServerError: Context "
                       "size has been exceeded. (the server's slots share one context, which other requests kept "
                       "full: start it with --parallel N, each slot then with its own window, or send it one command "
                       "at a time)")


def test_a_shared_context_full_for_a_request_alone_is_answered_once_the_others_end():
    with FakeOpenAIServer(responder=failing_first(2, SHARED_CONTEXT_FULL)) as server:
        backend = backend_for(server)
        prediction, _ = classify(backend)
    assert prediction.label == "good" and len(server.received) == 3 and len(backend.sleep.delays) == 1


def test_the_overflow_body_a_real_llama_server_sent_gives_its_figures():
    """llama-server (b1-0c1e570, `-c 2048`) refused a 3,031-token prompt with this body, verbatim."""
    body = ('{"error":{"code":400,"message":"request (3031 tokens) exceeds the available context size (2048 tokens), '
            'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":3031,"n_ctx":2048}}')
    with FakeOpenAIServer(responder=lambda _: Reply(status=400, raw=body, raw_type="application/json")) as server:
        with pytest.raises(ContextWindowExceeded) as caught:
            classify(backend_for(server))
    assert len(server.received) == 1 and caught.value.window == 2048
    assert str(caught.value) == ("the prompt (3031 tokens) does not fit the 2048-token context window of "
                                 "'openai/fake-model': use smaller inputs, or a model or server with a larger context")
