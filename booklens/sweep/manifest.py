"""The sweep manifest: which books, which systems, how they are judged.

```yaml
lm: openai/gpt-4o-mini          # default LM of every step (`--lm` overrides)
api_base: http://host:8000/v1   # optional (`--api-base` overrides); empty is the same as left out
books: [corpus/*.txt, more/one.epub]     # files, folders or globs, relative to this file
systems:
  - {name: hier-2048, method: hier, chunk_size: 2048}
  - {name: inc-2048, method: inc, chunk_size: 2048, lm: openai/other}
  - {name: released, summaries: released.json}   # {book key: summary}: judge these only
judge: {steps: [coherence, faithfulness], evidence: bm25}
```

A book's key is its file name without the extension. Everything a user can get wrong (a key
that does not exist or is given twice, a missing book, one book under two keys, two systems with one
name, a summaries file without one of the books, a bad value) is a one-line `BooklensError` raised here,
before anything is written and before any model loads. Each book is read here once (for each
`drop_matter` setting) to compare the texts; the sweep keeps their digests, or why one cannot be read
(`Sweep.book_reads`): a book that cannot be read fails its own cells when the sweep runs.
"""

from __future__ import annotations

import difflib
import functools
import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from booklens.errors import BooklensError, clipped, setting_name
from booklens.pipeline import JUDGE_TASKS
from booklens.records import read_json_file, read_text_file

BOOK_SUFFIXES = (".txt", ".epub")
# System names become directory names: keep them to characters every file system takes.
SYSTEM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")
# Keys a `summaries:` system may have besides its name: it makes no summary, so no summarizer settings.
SUMMARIES_SYSTEM_KEYS = {"name", "summaries", "drop_matter"}
# The section that holds the judge's settings: errors name each by its path under it (`judge.k`),
# those the pipeline's own checks find too (`as_keys=JUDGE_KEYS`).
JUDGE_KEYS = "judge"


def judge_key(key: str) -> str:
    """A judge setting as the manifest's errors name it: `judge.k`."""
    return setting_name(key, JUDGE_KEYS)


class _Strict(BaseModel):
    # Unknown keys are errors (a typo must not silently fall back to a default); values are not
    # coerced (`chunk_size: "2k"` or `steps: coherence` are errors, not guesses).
    model_config = ConfigDict(extra="forbid", strict=True)


def _optional_settings(model_name: str, config: type[BaseModel], doc: str, *, drop: tuple[str, ...] = (),
                       as_text: dict[str, Any] | None = None, **extra: Any) -> type[BaseModel]:
    """A manifest section with the fields of a pipeline config (same names, types and bounds: the
    pipeline stays the one source of truth), each optional: a setting left out takes the
    pipeline's default. `as_text` gives paths as the strings YAML holds."""
    import copy

    fields: dict[str, Any] = {}
    for field_name, info in config.model_fields.items():
        if field_name in drop:
            continue
        info = copy.copy(info)
        info.default, info.default_factory = None, None
        annotation = (as_text or {}).get(field_name, info.annotation)
        fields[field_name] = (Optional[annotation], info)
    fields.update(extra)
    return create_model(model_name, __base__=_Strict, __doc__=doc, **fields)


def _sections() -> tuple[type[BaseModel], type[BaseModel]]:
    from booklens.pipeline import JudgeConfig, SystemConfig

    system = _optional_settings(
        "SystemSpec", SystemConfig, "One system: a summarizer configuration, or a file of existing summaries.",
        drop=("summary_file", "summary_text"), as_text={"program": str},
        name=(str, ...), summaries=(Optional[str], None))
    judge = _optional_settings(
        "JudgeSpec", JudgeConfig, "How every system's summaries are judged (the same for all, so they compare).",
        as_text={"programs": dict[str, str]})
    return system, judge


SystemSpec, JudgeSpec = _sections()

# Keys the `Sweep` reads itself, not handed to the pipeline's configs as given (a path as text, null
# as none): `system_config`, `judge_config`.
SYSTEM_READ_APART = ("name", "summaries", "program")
JUDGE_READ_APART = ("programs",)


class ManifestSpec(_Strict):
    lm: Optional[str] = None
    api_base: Optional[str] = None
    books: Union[str, list[str]]
    systems: list[SystemSpec] = Field(min_length=1)  # type: ignore[valid-type]
    judge: JudgeSpec = Field(default_factory=JudgeSpec)  # type: ignore[valid-type]


# ---------------------------------------------------------------------------
# The resolved sweep


@dataclass(frozen=True)
class Book:
    key: str
    path: Path


@dataclass(frozen=True)
class Cell:
    """One (system, book) pair: a run directory `cells/<system>/<book>/` of the sweep."""

    system: str
    book: str

    @property
    def name(self) -> str:
        return f"{self.system}/{self.book}"


@dataclass
class Sweep:
    """A checked manifest: books by key, systems in manifest order, the judge, the default LM."""

    manifest: Path
    books: list[Book]
    systems: list[SystemSpec]
    judge: JudgeSpec
    lm: Optional[str] = None
    api_base: Optional[str] = None
    # summaries: system name -> {book key: summary text}
    summaries: dict[str, dict[str, str]] = field(default_factory=dict)
    # (book key, drop_matter) -> (digest of the text as a run reads it, or why it cannot be read), as
    # loading found them: what the sweep needs of a book before its cells run, without reading it again
    book_reads: dict[tuple[str, bool], tuple[Optional[str], Optional[str]]] = field(default_factory=dict)

    @property
    def cells(self) -> list[Cell]:
        return [Cell(s.name, b.key) for s in self.systems for b in self.books]

    def book(self, key: str) -> Book:
        return next(b for b in self.books if b.key == key)

    def system(self, name: str) -> SystemSpec:
        return next(s for s in self.systems if s.name == name)

    def book_read(self, key: str, drop_matter: bool = False) -> tuple[Optional[str], Optional[str]]:
        """(sha256 of the book's text as a run reads it with `drop_matter`, None) or (None, the first
        line of why it cannot be read); read here only when loading did not (`book_reads`)."""
        if (key, drop_matter) not in self.book_reads:
            self.book_reads[(key, drop_matter)] = _read_book(self.book(key).path, drop_matter)
        return self.book_reads[(key, drop_matter)]

    def system_config(self, name: str, book_key: str):
        """The pipeline's `SystemConfig` of one cell."""
        from booklens.pipeline import SystemConfig

        spec = self.system(name)
        given = spec.model_dump(exclude_unset=True, exclude=set(SYSTEM_READ_APART))
        if spec.summaries is not None:
            return SystemConfig(name=name, summary_text=self.summaries[name][book_key], **given)
        if spec.program is not None:
            given["program"] = Path(spec.program)
        return SystemConfig(name=name, **given)

    def judge_config(self):
        """The pipeline's `JudgeConfig` every cell shares."""
        from booklens.pipeline import JudgeConfig

        given = self.judge.model_dump(exclude_unset=True, exclude=set(JUDGE_READ_APART))
        if self.judge.programs:
            given["programs"] = {task: Path(p) for task, p in self.judge.programs.items()}
        return JudgeConfig(**given)


# ---------------------------------------------------------------------------
# Loading


def load_manifest(path: str | Path, *, lm: Optional[str] = None, api_base: Optional[str] = None) -> Sweep:
    """Read, check and resolve a manifest; `lm` / `api_base` (the command's options) override its own."""
    path = Path(path)
    data = _read_yaml(path)
    try:
        spec = ManifestSpec.model_validate(data)
    except ValidationError as exc:
        raise BooklensError(f"{path}: {_explain(exc, data)}") from None
    _check_nulls(spec, path, data)
    base = path.absolute().parent  # absolute: cells may run in other processes and on other nodes
    books = _resolve_books(path, base, [spec.books] if isinstance(spec.books, str) else spec.books)
    systems = spec.systems
    seen: set[str] = set()
    summaries: dict[str, dict[str, str]] = {}
    for i, system in enumerate(systems):
        where = f"{path}: systems[{i}]"
        if not SYSTEM_NAME.match(system.name) or system.name in (".", ".."):
            raise BooklensError(f"{where}: name {system.name!r} must start with an ASCII letter or digit and hold "
                                "only ASCII letters, digits and . _ - + = (it names a directory)")
        if system.name in seen:
            raise BooklensError(f"{where}: two systems are named {system.name!r}; system names must be unique")
        twin = next((name for name in seen if name.casefold() == system.name.casefold()), None)
        if twin is not None:
            raise BooklensError(f"{where}: the systems {twin!r} and {system.name!r} differ only in case: on a "
                                "case-insensitive file system (macOS, Windows) their cells would be one directory")
        seen.add(system.name)
        where = f"{path}: system {system.name!r}"
        if system.summaries is not None:
            extra = sorted(k for k in system.model_fields_set if k not in SUMMARIES_SYSTEM_KEYS)
            if extra:
                raise BooklensError(f"{where} judges the summaries in {system.summaries}; {', '.join(extra)} "
                                    "would not apply (remove it, or make a separate summarizing system)")
            summaries[system.name] = _read_summaries(_relative(base, system.summaries), books, where)
            system.summaries = str(_relative(base, system.summaries))
        else:
            from booklens.steps import check_method_options

            try:
                check_method_options(system.method or "hier", system.level_budgets, system.merge_context,
                                     max_summary_tokens=system.max_summary_tokens, as_keys=True)
            except BooklensError as exc:
                raise BooklensError(f"{where}: {exc}") from None
        if system.program is not None:
            program = _relative(base, system.program)
            _check_program(program, "summarize", where)
            system.program = str(program)
    book_reads = _refuse_repeated_books(path, books, (bool(system.drop_matter) for system in systems))
    judge = spec.judge
    _check_judge(judge, base, path)
    _check_lms(spec, path)
    api_base = _check_servers(spec, path, api_base, lm)
    return Sweep(manifest=path, books=books, systems=systems, judge=judge, lm=lm or spec.lm,
                 api_base=api_base or spec.api_base, summaries=summaries, book_reads=book_reads)


def _check_nulls(spec: ManifestSpec, manifest: Path, data: Any) -> None:
    """A key given with no value (YAML's null) passes the sections, where every key may be left out,
    but is no value for a pipeline setting that takes none (`chunk_size`, `judge.k`): named here, as
    any other bad value is, before the pipeline's configs are built from the sections."""
    from pydantic import TypeAdapter

    from booklens.pipeline import JudgeConfig, SystemConfig

    sections: list[tuple[list[Any], type[BaseModel], BaseModel, tuple[str, ...]]] = [
        (["systems", i], SystemConfig, system, SYSTEM_READ_APART) for i, system in enumerate(spec.systems)]
    sections.append((["judge"], JudgeConfig, spec.judge, JUDGE_READ_APART))
    for loc, config, section, apart in sections:
        for key in sorted(section.model_fields_set - set(apart)):
            if getattr(section, key) is not None:
                continue
            try:
                TypeAdapter(config.model_fields[key].annotation).validate_python(None)
            except ValidationError:
                raise BooklensError(f"{manifest}: {_where([*loc, key], data)}null is no value here; give one, "
                                    "or leave the key out for its default") from None


def _check_lms(spec: ManifestSpec, manifest: Path) -> None:
    """An empty `lm` is a mistake (an unset template variable, say), as an empty `--lm` is: refused,
    not taken for the sweep's default or the embedded model."""
    where = [(f"{manifest}: lm", spec.lm), (f"{manifest}: {judge_key('lm')}", spec.judge.lm)]
    where += [(f"{manifest}: system {s.name!r}: lm", s.lm) for s in spec.systems]
    for what, value in where:
        if value is not None and not value.strip():
            raise BooklensError(f"{what} is empty: name a model ('local', 'openai/gpt-4o-mini', ...) or leave it out")


def _check_servers(spec: ManifestSpec, manifest: Path, override: Optional[str],
                   lm: Optional[str]) -> Optional[str]:
    """Every api_base is an http(s) URL (the LM layer's own check), named as the manifest names it,
    and is kept as that check gives it back: stripped, and an empty one is no api_base at all, as
    an empty `--api-base` is (the step takes the sweep's server, checked before the sweep like the
    others). An api_base of a step whose LM is the embedded model would be ignored: refused
    by the rule `--api-base` beside `--lm local` is refused by; so is the sweep's own when every step
    runs on the embedded model. Returns the command's `override` (`--api-base`) so checked; `lm`
    is the command's `--lm`."""
    from booklens.lm.embedded import LOCAL_LM, refuse_server_options_for_embedded, resolve_lm_name
    from booklens.lm.remote import check_api_base

    override = check_api_base(override)
    where = [(f"{manifest}: api_base", spec), (f"{manifest}: {judge_key('api_base')}", spec.judge)]
    where += [(f"{manifest}: system {s.name!r}: api_base", s) for s in spec.systems]
    for what, section in where:
        section.api_base = check_api_base(section.api_base, what)
        if section.api_base is None:  # as if left out: sweep.json and the cells' configs do not list it
            section.model_fields_set.discard("api_base")
    # The steps that call an LM: the judge and each summarizing system (a `summaries:` one has no api_base).
    default_lm = lm or spec.lm
    calling = [(what, section) for what, section in where[1:] if getattr(section, "summaries", None) is None]
    for what, section in calling:
        refuse_server_options_for_embedded(section.lm or default_lm, section.api_base, api_base_name=what,
                                           lm_name="lm:")
    if override is None and all(resolve_lm_name(section.lm or default_lm) == LOCAL_LM for _, section in calling):
        refuse_server_options_for_embedded(LOCAL_LM, spec.api_base, api_base_name=where[0][0], lm_name="lm:")
    return override


def _read_yaml(path: Path) -> Any:
    import yaml

    text = read_text_file(path, "manifest")
    try:
        data = yaml.load(text, Loader=_unique_keys_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BooklensError(f"{path} is not valid YAML ({where}{problem})") from None
    if not isinstance(data, dict):
        raise BooklensError(f"{path}: a manifest is a YAML mapping with books, systems and judge "
                            f"(found {type(data).__name__})")
    if _holds_itself(data):
        raise BooklensError(f"{path}: a YAML alias refers to the list or mapping that holds it (such as "
                            "`books: &a [*a]`); give the values themselves")
    return data


def _holds_itself(value: Any, within: tuple[int, ...] = (), cleared: set[int] | None = None) -> bool:
    """Whether an alias makes a list or mapping contain itself (one shared by two keys is fine).
    Each list or mapping is looked into once (`cleared`: those that hold no cycle), so aliases of
    aliases, which would expand to an astronomical tree, cost what the YAML text holds."""
    if not isinstance(value, (list, dict)):
        return False
    if id(value) in within:
        return True
    cleared = set() if cleared is None else cleared
    if id(value) in cleared:
        return False
    items = value.values() if isinstance(value, dict) else value
    if any(_holds_itself(item, (*within, id(value)), cleared) for item in items):
        return True
    cleared.add(id(value))
    return False


@functools.lru_cache(maxsize=None)
def _unique_keys_loader() -> type:
    """`yaml.SafeLoader` that refuses a key given twice in one mapping. YAML loaders keep the last
    value silently, so a second `systems:` block would drop the first one's systems unseen."""
    import yaml
    from yaml.constructor import ConstructorError

    class UniqueKeysLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                # Before merges are flattened: a key that overrides a merged (`<<: *anchor`) one is
                # YAML's way of changing a copied setting, not a mistake.
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node.start_mark)
                    except TypeError:  # an unhashable key: the base constructor reports it
                        continue
                    if first is not key_node.start_mark:
                        raise ConstructorError(None, None, f"duplicate key {key!r}, first given on line "
                                               f"{first.line + 1}; give each key once", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeysLoader


def _explain(exc: ValidationError, data: Any) -> str:
    """The first validation error as 'where: what' in the manifest's own terms, then where the
    others are (`(and 2 more problems: system 'a': lm, judge.k)`)."""
    errors = exc.errors()
    # An unknown key first: a misspelt key is also the reason a required one is "missing".
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    unknown = err.get("type") == "extra_forbidden"
    others = [e for e in errors if e is not err and not (unknown and e.get("type") == "missing")]
    # `books` is a string or a list: pydantic reports each branch, one place here
    places = dict.fromkeys(_place(e, data) for e in others)
    places.pop(_place(err, data), None)
    if not places:
        return _explain_one(err, data)
    from booklens.vocabulary import counted

    return f"{_explain_one(err, data)} (and {counted(len(places), 'more problem')}: {', '.join(places)})"


def _place(err: Any, data: Any) -> str:
    """Where one validation error is, as the manifest names it (`system 'a': lm`, `judge.k`, `books`)."""
    loc = list(err.get("loc", ()))
    if loc and loc[0] == "books":
        return "books"
    return _where(loc, data).removesuffix(": ") or "the manifest"


def _explain_one(err: Any, data: Any) -> str:
    loc = list(err.get("loc", ()))
    kind = err.get("type", "")
    # `books` is a string or a list: pydantic reports both branches; name the field once.
    if loc and loc[0] == "books" and kind != "missing":
        return f"books: give a path, a folder or a glob, or a list of them (got {_shown(err.get('input'))})"
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(loc[:-1])
        hint = difflib.get_close_matches(key, allowed, n=1)
        suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
        return f"{_where(loc[:-1], data)}unknown key '{key}'{suggestion}; known keys: {', '.join(allowed)}"
    if kind == "missing":
        return f"{_where(loc[:-1], data)}missing key '{loc[-1]}'"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"{_where(loc, data)}{_shown(err.get('input'))} is not one of {expected}"
    return f"{_where(loc, data)}{err.get('msg', 'invalid value')} (got {_shown(err.get('input'))})"


def _allowed_keys(loc: list[Any]) -> list[str]:
    model: Any = ManifestSpec
    for part in loc:
        if part == "systems":
            model = SystemSpec
        elif part == "judge":
            model = JudgeSpec
    return list(model.model_fields)


def _where(loc: list[Any], data: Any) -> str:
    """'system 'hier-2048': chunk_size: ' for a location in the manifest."""
    prefix, rest = "", list(loc)
    if len(rest) >= 2 and rest[0] == "systems" and isinstance(rest[1], int):
        try:
            name = data["systems"][rest[1]]["name"]
        except (KeyError, IndexError, TypeError):
            name = None
        prefix = f"system {name!r}: " if isinstance(name, str) else f"systems[{rest[1]}]: "
        rest = rest[2:]
    parts: list[str] = []
    for part in rest:
        if isinstance(part, int) and parts:
            parts[-1] = f"{parts[-1]}[{part}]"
        else:
            parts.append(str(part))
    return prefix + ((".".join(parts) + ": ") if parts else "")


def _shown(value: Any) -> str:
    return clipped(json.dumps(value, default=str, ensure_ascii=False))


def _relative(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _pattern(base: Path, entry: str) -> str:
    """The glob of a relative entry under the manifest's folder, whose own name is taken literally
    (a manifest in `[draft]/` must not make `[draft]` a character class)."""
    p = Path(entry).expanduser()
    return str(p) if p.is_absolute() else os.path.join(glob.escape(str(base)), entry)


def _resolve_books(manifest: Path, base: Path, entries: list[str]) -> list[Book]:
    if not entries:
        raise BooklensError(f"{manifest}: books is empty; list book files, folders or globs")
    found: list[Path] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise BooklensError(f"{manifest}: books: an entry is empty")
        target = _relative(base, entry)
        # A path that exists is the file or folder it names, even when its name holds glob
        # characters (`Story [vol 1].txt`): only an entry that names nothing is a pattern.
        if target.is_dir():
            # As a glob of the folder: no hidden file (a Mac's `._name.txt` metadata, a tool's draft).
            files = sorted(p for p in target.iterdir() if p.is_file() and p.suffix.lower() in BOOK_SUFFIXES)
            matches = [p for p in files if not p.name.startswith(".")]
            if not matches:
                hidden = f" but hidden ones ({files[0].name}), which are books only when named" if files else ""
                raise BooklensError(f"{manifest}: books: the folder {target} holds no .txt or .epub file{hidden}")
            found.extend(matches)
        elif target.exists():
            found.append(target)
        elif glob.has_magic(entry):
            # As in a folder, only .txt and .epub files are books: `books/*` skips the README beside them.
            matches = sorted(Path(p) for p in glob.glob(_pattern(base, entry), recursive=True)
                             if Path(p).is_file() and Path(p).suffix.lower() in BOOK_SUFFIXES)
            if not matches:
                raise BooklensError(f"{manifest}: books: {entry!r} matches no .txt or .epub file (relative to {base})")
            found.extend(matches)
        else:
            from booklens.records import not_found, present

            try:
                present(target)  # a link loop is named as one, not as a missing book
            except BooklensError as exc:
                raise BooklensError(f"{manifest}: {exc}") from None
            raise BooklensError(f"{manifest}: {not_found('book', target)}")
    books: list[Book] = []
    by_key: dict[str, Path] = {}
    for p in found:
        try:
            str(p).encode("utf-8")
        except UnicodeEncodeError:  # bytes of another encoding: the key and path could not be recorded
            shown = os.fsencode(p).decode("utf-8", "replace")
            raise BooklensError(f"{manifest}: books: the file name {shown} is not valid UTF-8 (written in another "
                                "encoding); rename it") from None
        key = p.stem if p.suffix else p.name
        if key in (".", ".."):  # `..txt`, `...txt`: the cell directory cells/<system>/<key> would not be its own
            raise BooklensError(f"{manifest}: books: {p} has the key {key!r}, which cannot name a cell directory; "
                                "a book's key is its file name without the extension, so rename the file")
        if key in by_key:
            if by_key[key].resolve() == p.resolve():
                continue  # the same file named twice (overlapping globs)
            raise BooklensError(f"{manifest}: two books have the key {key!r} ({by_key[key]} and {p}); a book's "
                                "key is its file name without the extension, so rename one")
        twin = next((k for k in by_key if _folded(k) == _folded(key)), None)
        if twin is not None:
            how = "in case" if twin.casefold() == key.casefold() else "in case or in how their accents are encoded"
            raise BooklensError(f"{manifest}: the books {by_key[twin]} and {p} have keys that differ only {how} "
                                f"({twin!r} and {key!r}): on a case-insensitive file system (macOS, Windows) their "
                                "cells would be one directory, so rename one")
        by_key[key] = p
        books.append(Book(key, p))
    return books


def _folded(key: str) -> str:
    """A book key as macOS's file system compares names: accents in one encoding (NFC), case ignored."""
    import unicodedata

    return unicodedata.normalize("NFC", key).casefold()


def _read_book(path: Path, drop_matter: bool) -> tuple[Optional[str], Optional[str]]:
    """(digest of the text, None), or (None, why it cannot be read): see `Sweep.book_read`."""
    from booklens.errors import first_line
    from booklens.pipeline import sha256_text
    from booklens.text import read_book

    try:
        return sha256_text(read_book(path, drop_matter=drop_matter)), None
    except (BooklensError, OSError) as exc:
        return None, first_line(exc)


def _refuse_repeated_books(manifest: Path, books: list[Book], drop_matter: Iterable[bool] = (False,)
                           ) -> dict[tuple[str, bool], tuple[Optional[str], Optional[str]]]:
    """One book under two keys (a link, a copy under another name or with other line endings, the
    same book as .txt and .epub) would count twice in every mean and interval over books: refused.
    Books are compared by their texts as a run reads and digests them, once for each `drop_matter`
    setting the systems read them with; a book that cannot be read is left to fail in its cells.
    Returns what each read gave (`Sweep.book_reads`)."""
    reads: dict[tuple[str, bool], tuple[Optional[str], Optional[str]]] = {}
    for dropped in dict.fromkeys(drop_matter):
        seen: dict[str, Book] = {}
        for book in books:
            fingerprint, _ = reads[(book.key, dropped)] = _read_book(book.path, dropped)
            if fingerprint is None:
                continue
            first = seen.setdefault(fingerprint, book)
            if first is not book:
                how = "the same file" if first.path.resolve() == book.path.resolve() else "the same text"
                once = " once their front and back matter are dropped" if dropped else ""
                raise BooklensError(f"{manifest}: books: {first.path} and {book.path} are {how} under two keys "
                                    f"({first.key!r} and {book.key!r}){once}, so it would count twice; list it once")
    return reads


def _read_summaries(path: Path, books: list[Book], where: str) -> dict[str, str]:
    data = read_json_file(path, f"{where}: summaries file")
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise BooklensError(f"{where}: {path} must be a JSON object of {{book key: summary text}}")
    missing = [b.key for b in books if b.key not in data]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise BooklensError(f"{where}: {path} has no summary for the book {missing[0]!r}{more}")
    from booklens.inputs import wordless

    empty = [b.key for b in books if wordless(data[b.key])]
    if empty:
        raise BooklensError(f"{where}: {path}: the summary for the book {empty[0]!r} {wordless(data[empty[0]])}")
    return {b.key: data[b.key] for b in books}


def _check_program(path: Path, task: str, where: str) -> None:
    from booklens.records import present

    if not present(path) or not path.is_file():
        raise BooklensError(f"{where}: program artifact not found: {path}")
    from booklens.optimizers.artifacts import check_task

    try:
        check_task(path, task)
    except BooklensError as exc:
        raise BooklensError(f"{where}: {exc}") from None


def _check_judge(judge: JudgeSpec, base: Path, manifest: Path) -> None:
    """Steps and compiled programs; the rest (the evidence mode) is checked by the pipeline's own
    `check_configs` when the cells are planned."""
    if judge.steps is not None and len(set(judge.steps)) != len(judge.steps):
        raise BooklensError(f"{manifest}: {judge_key('steps')} lists a step twice")
    if judge.steps is not None and not judge.steps:
        raise BooklensError(f"{manifest}: {judge_key('steps')} is empty: a sweep with no judgment compares nothing "
                            "(list coherence, faithfulness or both)")
    steps = judge.steps if judge.steps is not None else ["coherence", "faithfulness"]
    # Settings of a step the judge does not take would be recorded in every run.json, never applied.
    for step, settings in (("faithfulness", ("evidence", "k", "budget_tokens", "passage_tokens", "max_claims")),
                           ("coherence", ("batch_size",))):
        unused = [name for name in settings if getattr(judge, name) is not None]
        if step not in steps and unused:
            raise BooklensError(f"{manifest}: {', '.join(map(judge_key, unused))} would not apply: "
                                f"{judge_key('steps')} has no {step}")
    for task, value in (judge.programs or {}).items():
        if task not in JUDGE_TASKS:
            raise BooklensError(f"{manifest}: {judge_key('programs')}: unknown task {task!r}; use "
                                f"{', '.join(JUDGE_TASKS)}")
        program = _relative(base, value)
        _check_program(program, task, f"{manifest}: {judge_key('programs')}.{task}")
        judge.programs[task] = str(program)
