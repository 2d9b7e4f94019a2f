"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import booklens  # noqa: F401  - first, so its offline settings apply before dspy imports litellm

REPO_ROOT = Path(__file__).resolve().parent.parent


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
def llama_server():
    """A real llama.cpp server (llama-cpp-python's, from the test extra) serving the embedded GGUF on a
    free loopback port with a 4096-token context and 2 threads; stopped when the session ends."""
    import importlib.util

    missing = [m for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"llama-cpp-python[server] is not installed (missing {', '.join(missing)}): "
                    "pip install -e '.[test]'")
    from booklens.testing import LlamaServer

    with LlamaServer(n_ctx=4096, n_threads=2) as server:
        yield server
