"""Ctrl-C (or SIGTERM) during an LM command: one line that says what is kept, and exit code 130 (143)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest

from booklens.testing import FakeOpenAIServer, Reply, run_command, terminal_command


def _wait_for_line(stream, prefix: str) -> list[str]:
    """The lines of `stream` up to and including the first that starts with `prefix` (all of them,
    should the process end first)."""
    lines = []
    for line in iter(stream.readline, ""):
        lines.append(line)
        if line.startswith(prefix):
            break
    return lines


@contextlib.contextmanager
def _interrupted(args: list, server: FakeOpenAIServer, env: dict, *, release: threading.Event | None = None,
                 sig: int = signal.SIGINT):
    """`booklens ARGS` started as from a terminal and sent Ctrl-C (or `sig`) once its first call reached the
    server; yields the process and its stderr up to the line that says the calls in flight end
    first. On the way out the held call is released (`release`) and a process still alive killed."""
    proc = subprocess.Popen(terminal_command(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
        while not server.received and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.received, "the command never called the LM"
        proc.send_signal(sig)
        yield proc, _wait_for_line(proc.stderr, "stopping:")
    finally:
        if release is not None:
            release.set()
        if proc.poll() is None:
            proc.kill()


def _stopped_after(args: list, env: dict, server: FakeOpenAIServer, requests: int, gate: threading.Event):
    """`booklens ARGS` started as from a terminal and sent Ctrl-C once the server has received
    `requests` requests; the held calls are then released (`gate`). The process (ended), its stderr up
    to the "stopping:" line, and the rest."""
    proc = subprocess.Popen(terminal_command(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
        while len(server.received) < requests and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.received) >= requests, f"the command did not reach request {requests}"
        proc.send_signal(signal.SIGINT)
        seen = _wait_for_line(proc.stderr, "stopping:")
        gate.set()
        _, rest = proc.communicate(timeout=60)
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
    return proc, seen, rest


def test_ctrl_c_while_a_call_is_in_flight_says_the_work_is_cached(tmp_path):
    """The call in flight ends (here with a dropped connection, which is not retried after Ctrl-C);
    then one line says what is kept."""
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light. A stranger called Zed arrives.", encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    gate = threading.Event()

    def respond(body):
        gate.wait(120)  # held until the command has taken the Ctrl-C
        return Reply(drop=True)

    with FakeOpenAIServer(responder=respond) as server:
        with _interrupted(["score", summary, "--zero-shot", "--concurrency", "1", "--lm", "openai/fake",
                           "--api-base", server.url], server, env, release=gate) as (proc, _):
            gate.set()
            _, stderr = proc.communicate(timeout=60)
        received = len(server.received)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    assert "Traceback" not in stderr
    assert received == 1  # the dropped call was not sent again


def test_ctrl_c_starts_no_queued_call_and_no_re_ask_when_calls_run_side_by_side(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text(" ".join(f"Maren lit lamp number {i} at dusk." for i in range(12)), encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    # The first call goes alone and is answered (the server's structured-output dialect is then
    # known: the rest run side by side). Each later call is held until the command has taken the
    # signal, so it lands while two are in flight; then the first of them ends with a dropped
    # connection, which the backend would otherwise retry, the others with an answer that does not
    # parse, which the command would otherwise ask again.
    from booklens.testing import PipelineResponder

    answer = PipelineResponder()
    replies = iter([None, Reply(drop=True)])
    gate = threading.Event()

    def respond(body):
        reply = next(replies, Reply(content="It reads fine."))
        if reply is None:
            return answer(body)
        gate.wait(120)
        return reply

    with FakeOpenAIServer(responder=respond) as server:
        proc = subprocess.Popen(terminal_command(["score", summary, "--zero-shot", "--batch-size", "1",
                                                   "--concurrency", "2", "--lm", "openai/fake",
                                                   "--api-base", server.url]),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
            while len(server.received) < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.received) == 3, "the command did not start two calls after the first"
            proc.send_signal(signal.SIGINT)
            seen = _wait_for_line(proc.stderr, "stopping:")
            gate.set()
            _, rest = proc.communicate(timeout=60)
            stderr = "".join(seen) + rest
        finally:
            gate.set()
            if proc.poll() is None:
                proc.kill()
        received = len(server.received)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    # The two calls in flight end; none of the nine queued sentences is asked, the dropped call is
    # not retried and the unusable answer is not asked again.
    assert received == 3



@pytest.mark.parametrize("sig, code, stopping", [
    (signal.SIGINT, 130, "stopping: the LM calls in flight end first"),
    (signal.SIGTERM, 143, "stopping: terminated; the LM calls in flight end first"),
], ids=["ctrl-c", "sigterm"])
def test_a_stop_lets_a_lone_call_end_and_keeps_its_answer(tmp_path, sig, code, stopping):
    """One call at a time runs on the main thread's behalf: Ctrl-C there still lets it end, its
    answer goes to the cache, no other call starts, and the rerun asks only what was left. SIGTERM
    (`timeout`, `docker stop`, a batch scheduler) is taken the same way, exit code 143: its default
    action lost the call in flight, and said nothing."""
    from booklens.testing import PipelineResponder

    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light. A stranger called Zed arrives.", encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    gate = threading.Event()
    answer = PipelineResponder()

    def respond(body):
        gate.wait(120)  # held until the command has taken the signal
        return answer(body)

    args = ["score", summary, "--zero-shot", "--batch-size", "1", "--concurrency", "1", "--lm", "openai/fake"]
    with FakeOpenAIServer(responder=respond) as server:
        with _interrupted([*args, "--api-base", server.url], server, env, release=gate, sig=sig) as (proc, seen):
            assert seen and seen[-1].startswith(stopping), seen
            gate.set()
            _, rest = proc.communicate(timeout=60)
        assert proc.returncode == code, rest
        assert rest.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
        assert len(server.received) == 1  # the second sentence was not asked
        # The rerun needs no process of its own (booklens.testing.run_command): the stop was the process's.
        again = run_command([*args, "--api-base", server.url], env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.received) == 2, (rest, again.stderr)  # only the second sentence's call is new
        assert "2 LM calls (1 from cache)" in again.stderr


def test_a_second_ctrl_c_quits_without_waiting_for_the_calls_in_flight(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light.", encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    # A stalled server: the call would hold the command until the server shuts down.
    with FakeOpenAIServer(responder=lambda body: Reply(hold=300, drop=True)) as server:
        with _interrupted(["score", summary, "--zero-shot", "--lm", "openai/fake", "--api-base", server.url],
                          server, env) as (proc, seen):
            assert seen[-1].startswith("stopping:")
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)  # the server would hold the call for 300 s
            exited_while_held = len(server.received) == 1 and not server.served
    assert proc.returncode == 130, stderr
    assert exited_while_held
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    assert "Traceback" not in stderr and "Exception ignored" not in stderr


def test_ctrl_c_in_the_middle_of_a_qa_run_leaves_only_the_unasked_questions_to_the_rerun(tmp_path):
    """Six questions, two asked side by side: Ctrl-C once the fourth is in flight. The questions in
    flight end and are cached; the rerun asks only the questions no call had reached."""
    import json

    book = tmp_path / "book.txt"
    book.write_text("The keeper waited every Thursday. " * 40 + "\n\nOnly the tender Marigold sails to Pellmark.\n\n"
                    + "The fog lifted in the afternoon. " * 40, encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{
        "QID": f"T-{i}", "Question": f"Question {i}: which ship sails to Pellmark?",
        "Options": {"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"}, "Gold": "B",
        "Aspect": "plot", "Complexity": "sh"} for i in range(1, 7)]), encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    gate, first_run = threading.Event(), threading.Event()
    first_run.set()

    def respond(body):
        if first_run.is_set() and len(server.received) >= 4:
            gate.wait(120)  # from the fourth question on, held until the command has taken the Ctrl-C
        return json.dumps({"answer": "B"})

    with FakeOpenAIServer(responder=respond) as server:
        args = ["qa", book, "--questions", questions, "--concurrency", "2", "--lm", "openai/fake",
                "--api-base", server.url]
        proc, seen, rest = _stopped_after(args, env, server, 4, gate)
        assert proc.returncode == 130, "".join(seen) + rest
        assert rest.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
        asked = len(server.received)
        assert asked in (4, 5)  # the fourth, and the fifth if the other worker had taken it
        first_run.clear()
        again = run_command(args, env=env)
        assert again.returncode == 0, again.stderr
        new = len(server.received) - asked
        assert new == 6 - asked  # only the questions no call had reached
        assert f"6 LM calls ({asked} from cache)" in again.stderr
        assert "Accuracy: 100.0 (6) of 6 scored questions" in again.stdout


def test_ctrl_c_in_the_middle_of_a_diverse_run_leaves_only_the_unasked_calls_to_the_rerun(tmp_path):
    """The fixture event summarized and judged, two calls side by side: Ctrl-C once the sixth call is
    in flight. The calls in flight end and are cached; the rerun sends only the calls no request had
    reached, and writes what an uninterrupted run writes."""
    import json
    from pathlib import Path

    events = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"
    gate, first_run = threading.Event(), threading.Event()
    before = [0]  # requests of the uninterrupted run, sent first

    def respond(body):
        if first_run.is_set() and len(server.received) >= before[0] + 6:
            gate.wait(120)  # from the sixth call on, held until the command has taken the Ctrl-C
        return json.dumps({"summary": "Sources disagree on the cause and the cost of the closure.",
                           "explanation": "It does.", "rating": 1})

    def record(path):
        data = json.loads(path.read_text(encoding="utf-8"))
        return {k: v for k, v in data.items() if k not in ("usage", "seconds")}

    with FakeOpenAIServer(responder=respond) as server:
        def args(out):
            return ["diverse", events, "--faithfulness", "likert", "--concurrency", "2", "--lm", "openai/fake",
                    "--api-base", server.url, "-o", out]

        whole = run_command(args(tmp_path / "whole.json"), env={**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "c0")})
        assert whole.returncode == 0, whole.stderr
        total = len(server.received)
        assert total == 18  # the summary, 6 binary and 1 Likert coverage ratings, 10 articles' faithfulness
        before[0] = total
        first_run.set()

        env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
        out = tmp_path / "diverse.json"
        proc, seen, rest = _stopped_after(args(out), env, server, total + 6, gate)
        assert proc.returncode == 130, "".join(seen) + rest
        assert rest.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
        assert "Traceback" not in "".join(seen) + rest
        assert not out.exists()  # no record that looks complete
        asked = len(server.received) - total
        assert asked in (6, 7)  # the sixth, and the seventh if the other worker had taken it
        first_run.clear()
        again = run_command(args(out), env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.received) - total - asked == total - asked  # only the calls no request had reached
        assert f"{total} LM calls ({asked} from cache)" in again.stderr
    assert record(out) == record(tmp_path / "whole.json")
