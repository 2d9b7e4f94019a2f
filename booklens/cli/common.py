"""Options and helpers shared by every command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from booklens import lm as lm_module
from booklens.errors import BooklensError

LMOption = Annotated[
    Optional[str],
    typer.Option("--lm", help="'local' (embedded SmolLM2, the default) or any LiteLLM model string; also BOOKLENS_LM."),
]
ApiBaseOption = Annotated[
    Optional[str], typer.Option("--api-base", help="Base URL of an OpenAI-compatible server (vLLM, llama.cpp, Ollama).")
]
ConcurrencyOption = Annotated[int, typer.Option("--concurrency", min=1, help="Independent LM calls run at once.")]
CacheDirOption = Annotated[
    Optional[Path], typer.Option("--cache-dir", help="Where completed LM calls are cached (BOOKLENS_CACHE_DIR).")
]
ProgramOption = Annotated[
    Optional[Path], typer.Option("--program", help="A compiled program artifact (JSON) from `booklens compile`.")
]
OutputOption = Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the result JSON here.")]


def setup_lm(lm: str | None, api_base: str | None = None, cache_dir: Path | None = None) -> lm_module.BooklensLM:
    """Build and install the LM for a command."""
    return lm_module.configure(lm_module.make_lm(lm, api_base=api_base, cache_dir=cache_dir))


def write_output(path: Path | None, payload: Any) -> None:
    """Write JSON atomically (a complete file or none), or print it when no path is given."""
    from booklens.records import save_json

    if path is None:
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
        return
    save_json(path, payload)
    typer.echo(f"wrote {path}", err=True)


def read_json_file(path: Path, what: str) -> Any:
    if not path.exists():
        raise BooklensError(f"{what} not found: {path}")
    if path.is_dir():
        raise BooklensError(f"{what} is a directory, not a file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError:
        raise BooklensError(f"{what} is not UTF-8 text: {path}") from None
    except json.JSONDecodeError as exc:
        raise BooklensError(f"{what} is not valid JSON ({path}: line {exc.lineno}: {exc.msg})") from None
