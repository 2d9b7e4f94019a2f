"""An internal error (a bug, not the user's input) is recorded and printed as one line, and that
line keeps no secret: the exception of a library underneath may quote the URL it was asked at,
password and all, or a key from the environment, and run.json or a sweep's report may be shared."""
from __future__ import annotations

import pytest

import booklens  # noqa: F401 - offline settings before dspy imports litellm

KEY = "sk-live-0123456789abcdef"
FAILURE = f"cannot reach http://reader:s3cr3t-pass@10.1.2.3:8000/v1 with key {KEY}"
REDACTED = "internal error: RuntimeError: cannot reach http://10.1.2.3:8000/v1 with key [redacted]"


@pytest.fixture
def secret_key(monkeypatch):
    monkeypatch.setenv("SOME_PROVIDER_API_KEY", KEY)


def test_the_internal_error_line_keeps_no_url_password_or_key(secret_key):
    from booklens.errors import internal_error

    assert internal_error(RuntimeError(FAILURE + "\nsecond line")) == REDACTED
    assert internal_error(KeyError()) == "internal error: KeyError"
    # redacted before the line is cut at 300 characters, which would leave a part of the secret unmatched
    assert internal_error(RuntimeError("x" * 280 + " " + KEY)) == f"internal error: RuntimeError: {'x' * 280} [redacted]"


def test_a_run_records_a_failed_steps_internal_error_without_secrets(secret_key, tmp_path, monkeypatch):
    import json

    from booklens.lm import FixedLMPool
    from booklens.pipeline import SystemConfig, run_book
    from booklens.programs.coherence import CoherenceScorer
    from tests.test_library_arguments import BOOK_TEXT, pipeline_lm

    def broken(self, *args, **kwargs):
        raise RuntimeError(FAILURE)

    monkeypatch.setattr(CoherenceScorer, "forward", broken)
    book = tmp_path / "book.txt"
    book.write_text(BOOK_TEXT)
    system = SystemConfig(chunk_size=256, context_window=2048, max_summary_tokens=128)
    run = run_book(book, tmp_path / "run", system, lms=FixedLMPool(pipeline_lm(), cache_dir=tmp_path / "c"),
                   concurrency=1, notify=lambda message: None)
    assert run.failures == {"coherence": REDACTED}
    written = (tmp_path / "run" / "run.json").read_text()
    assert "s3cr3t" not in written and KEY not in written and REDACTED in json.loads(written)["failures"].values()


def test_a_sweep_cell_records_an_internal_error_without_secrets(secret_key, tmp_path, monkeypatch):
    import booklens.pipeline
    from booklens.sweep.engines import CellTask, run_cell

    def broken(*args, **kwargs):
        raise RuntimeError(FAILURE)

    monkeypatch.setattr(booklens.pipeline, "run_book", broken)
    task = CellTask(system="a", book="b", book_path=str(tmp_path / "b.txt"), sweep_dir=str(tmp_path),
                    output=str(tmp_path / "cell"), system_config={}, judge_config={})
    assert run_cell(task, pool=None).error == REDACTED


def test_a_server_urls_password_is_kept_out_of_internal_errors_that_quote_it_alone(tmp_path):
    """The password of an `--api-base` URL, quoted without its URL by some library's exception."""
    from booklens.errors import internal_error
    from booklens.lm.remote import LiteLLMBackend

    LiteLLMBackend("openai/any", api_base="http://reader:pw-7f3a9@127.0.0.1:9/v1")
    assert internal_error(ValueError("basic auth with pw-7f3a9 was refused")) == \
        "internal error: ValueError: basic auth with [redacted] was refused"
