"""Compiled-program artifacts: DSPy's own JSON state (`program.save(path)`) plus a booklens block.

The file is exactly what `program.save("x.json")` writes (one entry per named predictor with its
demos and signature instructions, and `metadata.dependency_versions`), with one more key,
`metadata.booklens`:

    {"kind": "booklens.program", "format_version": 1, "task": "coherence",
     "program": "ConfusionDetector", "predictors": ["detect"], "booklens_version": "0.1.0",
     "dataset": {"path": ..., "sha256": ...}, "split": {...}, "seed": 0,
     "optimizer": "bootstrap", "budget": {...}, "lm": "local/...",
     "metrics": {"dev": ..., "test": ...}}

So plain DSPy can still `program.load()` it. No pickle is ever written or read. Loading checks
that the file is an artifact of the task it is loaded into and matches the program's predictors.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import dspy

from booklens.errors import BooklensError, first_line
from booklens.vocabulary import counted

ARTIFACT_KIND = "booklens.program"
ARTIFACT_FORMAT_VERSION = 1

# Names a task may be loaded under (a CLI command name and the task it runs).
TASK_ALIASES = {"summarize": "summarize", "summarization": "summarize", "score": "coherence",
                "confusion": "coherence", "verify": "verification", "claims": "decomposition"}


def canonical_task(task: str) -> str:
    return TASK_ALIASES.get(task, task)


def program_state(program: dspy.Module) -> dict[str, Any]:
    """The JSON state DSPy's `program.save(path)` writes, read back as a dict."""
    with tempfile.TemporaryDirectory(prefix="booklens-artifact-") as tmp:
        path = Path(tmp) / "program.json"
        try:
            program.save(str(path))
        except Exception as exc:
            raise BooklensError(f"cannot save the compiled program as JSON: {first_line(exc)}") from None
        return json.loads(path.read_text(encoding="utf-8"))


def predictor_names(program: dspy.Module) -> list[str]:
    return [name for name, _ in program.named_predictors()]


def signature_fields(program: dspy.Module) -> dict[str, list[str]]:
    """Each predictor's field names in order (DSPy restores field texts by position)."""
    return {name: list(p.signature.fields) for name, p in program.named_predictors()}


def save_program(program: dspy.Module, path: str | Path, *, task: str, **metadata: Any) -> dict[str, Any]:
    """Write `program`'s DSPy JSON state with the booklens metadata block, atomically.
    Returns the metadata block. Keys are kept in a fixed order so equal programs give equal files."""
    from booklens import __version__
    from booklens.records import save_json

    state = program_state(program)
    for name in predictor_names(program):
        if isinstance(state.get(name), dict):
            state[name]["lm"] = None  # the LM is chosen at run time
    block = {
        "kind": ARTIFACT_KIND,
        "format_version": ARTIFACT_FORMAT_VERSION,
        "task": canonical_task(task),
        "program": type(program).__name__,
        "predictors": predictor_names(program),
        "fields": signature_fields(program),
        "booklens_version": __version__,
        **metadata,
    }
    state.setdefault("metadata", {})["booklens"] = block
    save_json(path, state)
    return block


def read_artifact(path: str | Path) -> dict[str, Any]:
    """Read and validate an artifact file; one-line `BooklensError`s for every way it can be wrong."""
    from booklens.records import parse_json, present

    path = Path(path)
    if not present(path):
        raise BooklensError(f"program artifact not found: {path}")
    if path.is_dir():
        raise BooklensError(f"program artifact is a directory, not a file: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x80\x04" or raw[:1] == b"\x80":
        raise BooklensError(f"{path} is a pickle; booklens loads only JSON program artifacts (never pickle)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BooklensError(f"program artifact {path} is corrupted: not UTF-8 text") from None
    state = parse_json(text, path, "program artifact")
    metadata = state.get("metadata") if isinstance(state, dict) else None
    if metadata is not None and not isinstance(metadata, dict):
        raise _invalid(path, f"its metadata is {_json_type(metadata)}, not an object")
    block = (metadata or {}).get("booklens") if isinstance(state, dict) else None
    if not isinstance(block, dict) or block.get("kind") != ARTIFACT_KIND:
        raise BooklensError(f"{path} is not a booklens program artifact (no booklens metadata); "
                            "make one with `booklens compile`")
    version = block.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BooklensError(f"program artifact {path} is corrupted: its format version is missing")
    if version < 1:  # versions count from 1
        raise BooklensError(f"program artifact {path} is corrupted: its format version {version} is none "
                            "booklens wrote")
    if version > ARTIFACT_FORMAT_VERSION:
        raise BooklensError(f"{path} was written by a newer booklens (artifact format {version}; this version "
                            f"reads up to {ARTIFACT_FORMAT_VERSION}); upgrade booklens or recompile")
    if not isinstance(block.get("task"), str) or not isinstance(block.get("predictors"), list):
        raise BooklensError(f"program artifact {path} is corrupted: its task or predictor list is missing")
    _check_block(path, block)
    return state


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _invalid(path: str | Path, what: str) -> BooklensError:
    return BooklensError(f"{path} is not a valid booklens artifact: {what}")


def _check_block(path: str | Path, block: dict[str, Any]) -> None:
    """The shape of every metadata key booklens reads, checked once here so that no consumer
    (load_program, evaluate's notes, calibrate's judge choice) meets a value it cannot use."""
    predictors = block["predictors"]
    bad = [name for name in predictors if not isinstance(name, str) or not name]
    if bad:
        raise _invalid(path, f"its predictor list holds {json.dumps(bad[0])[:60]}, which is not a predictor name")
    fields = block.get("fields")
    if fields is not None:
        if not isinstance(fields, dict):
            raise _invalid(path, f"its fields are {_json_type(fields)}, not an object")
        for name, names in fields.items():
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise _invalid(path, f"the fields of predictor {name} are {_json_type(names)}, not a list of names")
    for key in ("program_config", "dataset"):
        value = block.get(key)
        if value is not None and not isinstance(value, dict):
            raise _invalid(path, f"its {key} is {_json_type(value)}, not an object")
    config = block.get("program_config") or {}
    for key in ("label_set", "method"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise _invalid(path, f"its program_config.{key} is {_json_type(config[key])}, not a string")
    seed = block.get("seed")
    if seed is not None:  # evaluate splits the data with it: only a seed --seed could give
        from booklens.data.splits import SEED_RANGE

        if not isinstance(seed, int) or isinstance(seed, bool) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            shown = seed if isinstance(seed, int) and not isinstance(seed, bool) else _json_type(seed)
            raise _invalid(path, f"its seed is {shown}, not one from {SEED_RANGE[0]} to {SEED_RANGE[1]}")
    dataset = block.get("dataset") or {}
    for key in ("path", "sha256"):
        if dataset.get(key) is not None and not isinstance(dataset[key], str):
            raise _invalid(path, f"its dataset.{key} is {_json_type(dataset[key])}, not a string")


def artifact_metadata(path: str | Path) -> dict[str, Any]:
    return read_artifact(path)["metadata"]["booklens"]


def check_task(path: str | Path, task: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate the file and that it was compiled for `task`; returns the state."""
    state = state if state is not None else read_artifact(path)
    block = state["metadata"]["booklens"]
    want, have = canonical_task(task), canonical_task(block["task"])
    if want != have:
        raise BooklensError(f"{path} is a compiled '{have}' program and cannot be loaded as a '{want}' "
                            f"program; compile one with `booklens compile {want}`")
    return state


def load_program(program: dspy.Module, path: str | Path, task: str) -> dspy.Module:
    """Load the compiled state in `path` into `program` (in place) and return it.

    Raises `BooklensError` when the file is missing, not JSON, not an artifact, from a newer
    format, compiled for another task, or made for a program with other predictors."""
    state = check_task(path, task)
    block = state["metadata"]["booklens"]
    want = predictor_names(program)
    have = list(block["predictors"])
    if sorted(want) != sorted(have):
        raise BooklensError(
            f"{path} does not fit this {canonical_task(task)} program: it holds predictors "
            f"{', '.join(have) or 'none'} but the program has {', '.join(want) or 'none'} "
            f"(compiled for {block.get('program', '?')}{_config_hint(block)})")
    fields = block.get("fields")
    if isinstance(fields, dict):
        current = signature_fields(program)
        changed = [name for name in want if name in fields and list(fields[name]) != current[name]]
        if changed:
            name = changed[0]
            raise BooklensError(
                f"{path} was compiled for another version of the {canonical_task(task)} program: predictor "
                f"{name} had fields {', '.join(fields[name])}, now {', '.join(current[name])}; recompile it")
    label_set = getattr(program, "label_set", None)
    if label_set is not None:
        compiled_for = (block.get("program_config") or {}).get("label_set", "four-way")
        if compiled_for != label_set:
            raise BooklensError(f"{path} is a {compiled_for} {canonical_task(task)} program and cannot be loaded "
                                f"as a {label_set} one")
    missing = [name for name in want if not isinstance(state.get(name), dict)]
    if missing:
        raise BooklensError(f"program artifact {path} is corrupted: no state for {', '.join(missing)}")
    # Load into a copy first, so a failure leaves the caller's program untouched.
    trial = copy.deepcopy(program)
    try:
        for name, predictor in trial.named_predictors():
            entry = dict(state[name])
            entry["lm"] = None
            demos = entry.get("demos")
            if not isinstance(demos, list) or not all(isinstance(d, dict) for d in demos) \
                    or not isinstance(entry.get("signature"), dict):
                raise ValueError(f"{name} has no list of demo objects or no signature")
            problem = _signature_problem(entry["signature"])
            if problem:
                raise ValueError(f"predictor {name}: {problem}")
            predictor.load_state(entry)
            problem = _demo_problem(predictor.signature, predictor.demos)
            if problem:
                raise ValueError(f"predictor {name}: {problem}")
    except BooklensError:
        raise
    except Exception as exc:
        raise BooklensError(f"program artifact {path} is corrupted: {first_line(exc)}") from None
    for (name, predictor), (_, loaded) in zip(program.named_predictors(), trial.named_predictors()):
        predictor.__dict__.update(loaded.__dict__)
    program._booklens_artifact = block  # noqa: SLF001 - lets commands record what they ran
    return program


def _demo_problem(signature: Any, demos: list[Any]) -> str | None:
    """A demo whose closed-set output (a label, a verdict, an option letter, or an item of a list of
    them: the kinds of confusion) is none of the values the field allows: the model would be shown
    an example of an answer it must not give."""
    from typing import Annotated, Literal, get_args, get_origin

    from booklens.signatures.answers import choice_reader

    def bare(kind: Any) -> Any:
        return get_args(kind)[0] if get_origin(kind) is Annotated else kind

    for field_name, field in signature.output_fields.items():
        kind = bare(field.annotation)
        listed = get_origin(kind) is list and bool(get_args(kind))
        if listed:
            kind = bare(get_args(kind)[0])
        if get_origin(kind) is not Literal:
            continue
        allowed = get_args(kind)
        read = choice_reader(tuple(str(v) for v in allowed))
        for i, demo in enumerate(demos, start=1):
            value = demo.get(field_name) if hasattr(demo, "get") else None
            values = value if listed and isinstance(value, list) else [value]
            for item in values:
                if item is not None and item not in allowed and read(str(item)) not in allowed:
                    return (f"demo {i} answers {field_name} {item!r}, which is none of "
                            f"{', '.join(repr(v) for v in allowed)}")
    return None


def _signature_problem(signature: dict[str, Any]) -> str | None:
    """What in a saved signature DSPy would load as it is but could not run: instructions or field
    texts that are not text make every call fail, each failure looking like an unparseable answer."""
    if "instructions" not in signature:
        return "its signature has no instructions"
    if not isinstance(signature["instructions"], str):
        return f"its instructions are {_json_type(signature['instructions'])}, not text"
    fields = signature.get("fields")
    if not isinstance(fields, list):
        return f"its signature fields are {_json_type(fields)}, not a list"
    for i, field in enumerate(fields, start=1):
        if not isinstance(field, dict):
            return f"its signature field {i} is {_json_type(field)}, not an object"
        for key in ("prefix", "description"):
            if key not in field:
                return f"its signature field {i} has no {key}"
            if not isinstance(field[key], str):
                return f"the {key} of its signature field {i} is {_json_type(field.get(key))}, not text"
    return None


def demos_among(program: dspy.Module, examples: list[dspy.Example]) -> int:
    """How many of `examples` are demos of `program`: a demo is an example when every input field
    of its predictor that both carry has the same value (a labeled demo is a whole example; a
    bootstrapped one keeps the example's inputs)."""
    def same(a: Any, b: Any) -> bool:  # a saved demo holds lists where the example may hold tuples
        return a == b or (type(a) is not type(b)
                          and json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr))

    keyed = []
    for _, predictor in program.named_predictors():
        for demo in predictor.demos:
            fields = {k: demo[k] for k in predictor.signature.input_fields if k in demo}
            if fields:
                keyed.append(fields)
    return sum(1 for example in examples
               if any(all(k in example and same(example[k], v) for k, v in fields.items()) for fields in keyed))


# Optimizers that choose among candidates on the dev split (the others use only train).
DEV_CHOOSERS = ("random-search", "mipro", "gepa")


def held_out_notes(label: str, block: dict[str, Any], program: dspy.Module, examples: list[dspy.Example], *,
                   digest: str, seed: int, split: str,
                   overlap: Optional[Callable[[bool], tuple[int, int]]] = None) -> list[str]:
    """Why an artifact's figures on `examples` (the `split` of the data with sha256 `digest`, split
    with `seed`) may not be held out: other data, another seed, the split it was compiled on, and
    how many of the examples are its own demos. `overlap(dev_too)` counts the examples (and their
    books) from books the artifact learned from, drawn with its own seed; without it, another seed
    is a note that the split may hold them."""
    notes = []
    dataset = block.get("dataset") or {}
    compiled_seed = block.get("seed")
    if dataset.get("sha256") and dataset.get("sha256") != digest:
        notes.append(f"{label} was compiled on other data ({dataset.get('path')}); its splits may overlap "
                     "this data's")
    elif isinstance(compiled_seed, int) and compiled_seed != seed:
        if overlap is None:
            notes.append(f"{label} was compiled with seed {compiled_seed}; with seed {seed} the {split} split may "
                         f"hold books it was compiled on (use --seed {compiled_seed})")
        else:
            n, books = overlap(block.get("optimizer") in DEV_CHOOSERS)
            if n:
                notes.append(f"{label} was compiled with seed {compiled_seed}; with seed {seed}, {n} of the "
                             f"{len(examples)} {split} examples are from {counted(books, 'book')} it was compiled "
                             f"on (use --seed {compiled_seed})")
    elif split == "train" or (split == "dev" and block.get("optimizer") in DEV_CHOOSERS):
        notes.append(f"{label} was compiled on this {split} split: its figures on it are not held out")
    shared = demos_among(program, examples)
    if shared:
        notes.append(f"{shared} of the {len(examples)} examples are demos of {label}: its figures on them "
                     "are inflated")
    return notes


def compiled_split_size(blocks: list[dict[str, Any]], split: str, same_data: set[str], seed: int) -> int | None:
    """The size of `split` recorded by the first artifact of `blocks` compiled on this data (its dataset
    digest in `same_data`) split with `seed`: evaluate then runs on the examples whose figure compile
    reported. None (the task's subset size) when that artifact scored nothing on the split, or none
    was compiled on this split of this data."""
    for block in blocks:
        if (block.get("dataset") or {}).get("sha256") not in same_data or block.get("seed") != seed:
            continue
        sizes = (block.get("split") or {}).get("sizes") if isinstance(block.get("split"), dict) else None
        recorded = sizes.get(split) if isinstance(sizes, dict) else None
        # 0: compiled with --no-test, nothing was scored on the split (not "the whole split")
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
            return recorded
        return None
    return None


def _config_hint(block: dict[str, Any]) -> str:
    config = block.get("program_config") or {}
    method = config.get("method")
    return f", method {method}" if method else ""


def sha256_of(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    path = Path(path)
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(path)).encode("utf-8") + b"\0")
            digest.update(_file_digest(file).encode("ascii"))
        return digest.hexdigest()
    return _file_digest(path)


def _file_digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["ARTIFACT_FORMAT_VERSION", "ARTIFACT_KIND", "artifact_metadata", "check_task", "compiled_split_size",
           "demos_among", "held_out_notes", "load_program", "read_artifact", "save_program", "sha256_of"]
