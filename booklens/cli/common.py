"""Options and helpers shared by every command. Light to import: `booklens --help` and argument
errors load no model, no dspy, no litellm."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Iterable, Optional

import typer

from booklens.data.splits import SPLITS
from booklens.lm.remote import STRUCTURED_MODES

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
ZeroShotOption = Annotated[bool, typer.Option(
    "--zero-shot", help="Judge with the zero-shot program instead of the few-shot one booklens ships "
                        "(a --program artifact takes precedence for its task).")]


def echo_judge(judge) -> None:
    """The judge line (who judged, its agreement with humans, any warning) under a score."""
    if judge is not None:
        from booklens.judges import judge_line

        typer.echo(judge_line(judge), err=True)


def choices(name: str, values: Iterable[str]) -> Any:
    """A typer choice type whose values come from the library's one list of them."""
    return Enum(name, {v: v for v in values}, type=str)


# The train/dev/test split of a dataset, by book (`booklens.data.splits`).
SplitName = choices("SplitName", SPLITS)
Structured = choices("Structured", STRUCTURED_MODES)
StructuredOption = Annotated[
    Optional[Structured],
    typer.Option("--structured", help="How output schemas reach a LiteLLM backend: auto (json_schema, falling back to "
                                      "json_object+schema, then none, as the server refuses), schema, json, off; "
                                      "also BOOKLENS_STRUCTURED. The embedded model always decodes under the schema."),
]
RpmOption = Annotated[
    Optional[int],
    typer.Option("--rpm", min=1, help="At most this many requests per minute to a LiteLLM backend, over all threads; "
                                      "also BOOKLENS_RPM."),
]
TpmOption = Annotated[
    Optional[int],
    typer.Option("--tpm", min=1, help="At most this many tokens (prompt + answer budget) per minute to a LiteLLM "
                                      "backend, over all threads; also BOOKLENS_TPM."),
]


def evidence_enum(name: str, *, exclude: tuple[str, ...] = ()) -> type[Enum]:
    """An option type of the evidence modes of `booklens.retrieval` (minus `exclude`), whose
    `help` is the modes' one-line description."""
    from booklens.retrieval import EVIDENCE_MODES, evidence_help

    modes = tuple(m for m in EVIDENCE_MODES if m not in exclude)
    enum = choices(name, modes)
    enum.help = evidence_help(modes)
    return enum


def lm_options(structured: Structured | str | None = None, rpm: int | None = None,
               tpm: int | None = None) -> dict[str, Any]:
    """The backend options of a command (`--structured`, `--rpm`, `--tpm`) as `make_lm` / `LMPool` take them."""
    return {"structured": getattr(structured, "value", structured), "rpm": rpm, "tpm": tpm}


def setup_lm(lm: str | None, api_base: str | None = None, cache_dir: Path | None = None, *,
             structured: Structured | str | None = None, rpm: int | None = None, tpm: int | None = None):
    """Build the LM a command names and make it the LM of every DSPy program in this process."""
    from booklens.lm.remote import resolve_api_base

    resolve_api_base(api_base)  # a malformed URL fails here, before DSPy and LiteLLM load
    from booklens.lm import configure, make_lm

    return configure(make_lm(lm, api_base=api_base, cache_dir=cache_dir, **lm_options(structured, rpm, tpm)))


def write_output(path: Path | None, payload: Any) -> None:
    """Write JSON atomically (a complete file or none), or print it when no path is given."""
    from booklens.records import save_json

    if path is None:
        if hasattr(payload, "model_dump"):
            payload = payload.model_dump(mode="json")
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
        return
    save_json(path, payload)
    typer.echo(f"wrote {path}", err=True)


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file a user gave, or a one-line error (see `booklens.records.read_json_file`)."""
    from booklens.records import read_json_file as read

    return read(path, what)
