"""Ctrl-C during an LM command: one line that says what is kept, and exit code 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from booklens.testing import FakeOpenAIServer, Reply


# `booklens ARGS` with SIGINT as a terminal's foreground command has it. A command started in the
# background by a non-interactive shell (as CI may start the tests) inherits SIGINT ignored, and
# Python then keeps ignoring it, as it should: the launcher restores the default before booklens starts.
AS_FROM_A_TERMINAL = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "os.execv(sys.executable, [sys.executable, '-m', 'booklens', *sys.argv[1:]])"
)


def test_ctrl_c_while_a_call_is_in_flight_says_the_work_is_cached(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light. A stranger called Zed arrives.", encoding="utf-8")
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    # The server holds the call until it shuts down: the signal always lands while the command waits on it.
    with FakeOpenAIServer(responder=lambda body: Reply(hold=120, drop=True)) as server:
        proc = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, "score", str(summary), "--zero-shot",
                                 "--concurrency", "1", "--lm", "openai/fake", "--api-base", server.url],
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
