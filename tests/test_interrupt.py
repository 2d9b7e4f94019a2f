"""Ctrl-C during an LM command: one line that says what is kept, and exit code 130."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from booklens.testing import FakeOpenAIServer, Reply, terminal_command


def test_ctrl_c_while_a_call_is_in_flight_says_the_work_is_cached(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light. A stranger called Zed arrives.", encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    # The server holds the call until it shuts down: the signal always lands while the command waits on it.
    with FakeOpenAIServer(responder=lambda body: Reply(hold=120, drop=True)) as server:
        proc = subprocess.Popen(terminal_command(["score", summary, "--zero-shot", "--concurrency", "1",
                                                   "--lm", "openai/fake", "--api-base", server.url]),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
            while not server.received and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.received, "the command never called the LM"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    assert "Traceback" not in stderr


def test_ctrl_c_starts_no_queued_call_and_no_re_ask_when_calls_run_side_by_side(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text(" ".join(f"Maren lit lamp number {i} at dusk." for i in range(12)), encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    # Each call ends 3 s after it arrives (the signal lands while the first two are in flight):
    # the first with a dropped connection, which the backend would otherwise retry, the others
    # with an answer that does not parse, which the command would otherwise ask again.
    replies = iter([Reply(hold=3, drop=True)])

    def respond(body):
        return next(replies, Reply(content="It reads fine.", hold=3))

    with FakeOpenAIServer(responder=respond) as server:
        proc = subprocess.Popen(terminal_command(["score", summary, "--zero-shot", "--batch-size", "1",
                                                   "--concurrency", "2", "--lm", "openai/fake",
                                                   "--api-base", server.url]),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120  # a guard against a hang, not a timing assumption
            while len(server.received) < 2 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.received) == 2, "the command did not start two calls"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        received = len(server.received)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    # The two calls in flight end; none of the ten queued sentences is asked, the dropped call is
    # not retried and the unusable answer is not asked again.
    assert received == 2
