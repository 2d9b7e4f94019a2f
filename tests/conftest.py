"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under `pytest -n 2` the two workers share the two cores. llama.cpp (and torch) run a model on
# OpenMP threads that meet at a barrier after every operation, so one thread descheduled by the
# other worker's load stalls the rest: each worker, and the commands it starts, uses one thread.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")

import booklens  # noqa: E402,F401  - first, so its offline settings apply before dspy imports litellm


def _build_each_app_once() -> None:
    """typer's CliRunner builds the click command from the app on every invoke (0.07 s here, more
    than most commands under test take); an app does not change while the tests run."""
    import typer.main
    import typer.testing

    built: dict[int, tuple] = {}  # id(app) -> (app, command): the app is kept, so its id is not reused

    def get_command(app):
        if id(app) not in built:
            built[id(app)] = (app, typer.main.get_command(app))
        return built[id(app)][1]

    typer.testing._get_command = get_command


_build_each_app_once()

REPO_ROOT = Path(__file__).resolve().parent.parent

# The files that take longest (`--durations`, `pytest -n 2` on 2 cores) start first. Under
# `--dist loadfile` a file runs on one worker from start to end, and xdist would start them by
# number of tests, which put the Ray and llama.cpp server files last while the other worker sat idle.
# The rest keep their order; pyproject.toml turns xdist's reordering off.
LONGEST_FIRST = ("test_sweep.py", "test_real_server.py", "test_sweep_ray.py", "test_report.py", "test_judges_cli.py",
                 "test_summarize_cli.py", "test_backends.py", "test_faithfulness_cli.py", "test_embedded_prefix.py",
                 "test_coherence_cli.py", "test_startup.py", "test_compile.py", "test_interrupt.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The project's shared/ folder: ``../shared`` beside the repo, or ``$BOOKLENS_SHARED``."""
    configured = os.environ.get("BOOKLENS_SHARED")
    path = Path(configured) if configured else REPO_ROOT.parent / "shared"
    if not path.is_dir():
        how = "BOOKLENS_SHARED" if configured else "../shared relative to the repo root (or set BOOKLENS_SHARED)"
        pytest.skip(f"shared data folder not found at {path} ({how})")
    return path


@pytest.fixture(scope="session")
def books_dir(shared_dir: Path) -> Path:
    """shared/data/books: public-domain books as UTF-8 .txt files."""
    path = shared_dir / "data" / "books"
    if not path.is_dir() or not any(path.glob("*.txt")):
        pytest.skip(f"no books found in {path}")
    return path


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    """A real llama.cpp server (llama-cpp-python's, from the test extra) serving the embedded GGUF on a
    free loopback port with a 4096-token context and the embedded backend's weights and threads (1
    under `pytest -n 2`); stopped when the session ends."""
    import importlib.util

    missing = [m for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"llama-cpp-python[server] is not installed (missing {', '.join(missing)}): "
                    "pip install -e '.[test]'")
    from booklens.testing import LlamaServer

    with LlamaServer(n_ctx=4096, weights_folder=tmp_path_factory.mktemp("weights")) as server:
        yield server


@pytest.fixture
def story_opening(tmp_path: Path) -> Path:
    """The sample story's first 23 paragraphs (about 1,200 tokens) as a book file: small input for
    the end-to-end checks that run the real embedded model."""
    story = REPO_ROOT / "examples" / "sample_story.txt"
    path = tmp_path / "opening.txt"
    path.write_text("\n\n".join(story.read_text(encoding="utf-8").split("\n\n")[:23]), encoding="utf-8")
    return path
