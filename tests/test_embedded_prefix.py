"""The embedded backend's one llama.cpp context: the scheduler runs calls that share a prefix
back to back, and consecutive calls re-evaluate only what differs (real model)."""

from __future__ import annotations

import threading

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
    assert default_threads() == max(1, os.cpu_count() or 1)
    assert LocalBackend(n_threads=3).n_threads == 3
    # prompts are evaluated with the same threads as tokens are generated (llama-cpp-python's own
    # default for prompts is every core)
    params = LocalBackend(n_threads=1)._model().context_params
    assert (params.n_threads, params.n_threads_batch) == (1, 1)


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
    assert len(written[1]) == 1  # no partial file left behind
    # a folder that cannot be written: the shipped file, with a warning
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert stored_weights(shipped, "f16", blocker / "models") == shipped
    assert "running the embedded model from its shipped" in capsys.readouterr().err
    with pytest.raises(LMError, match="unknown weight format"):
        LocalBackend(weights="q2")
