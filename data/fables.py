"""FABLES (Kim et al., 2024): claims from LLM summaries of books, with human faithfulness labels.

The release is one JSON object: book title -> summarizer -> {summary, general_comment,
claims: {"0": {claim, label, evidence, reason}, ...}} (the public file wraps it as
{"canary": ..., "FABLES": {...}}; both forms load). Labels are Yes / No /
PartialSupport / Inapplicable, booklens' faithful / unfaithful / partial support /
can't verify. The books themselves are copyrighted and not part of the release.

`load_fables` turns a file into `FablesSummary` records; `decomposition_examples`
and `verification_examples` turn records into `dspy.Example`s; `fables_splits`
splits them by book with `booklens.data.splits.split_by_book`.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from pydantic import BaseModel, Field

from booklens.data.splits import DEFAULT_FRACTIONS, DEFAULT_SEED, split_by_book
from booklens.errors import BooklensError
from booklens.vocabulary import FABLES_LABEL_NAMES, FablesLabel

FABLES_URL = "https://github.com/mungg/FABLES/raw/main/data/FABLES.json.zip"
# The order of the seed's Table 2.
SUMMARIZERS = ("GPT-3.5-TURBO", "MIXTRAL", "GPT-4", "GPT-4-TURBO", "CLAUDE-3-OPUS")
# The seven books of the seed's Table 5 (its §G.3), as the release names them. Their faithful and
# unfaithful claims in the public release are exactly Table 5's 723 (654 faithful, 69 unfaithful).
TABLE5_BOOKS = ("yellowface", "Only For The Week", "Viciously Yours", "Six Scorched Roses", "Sorrow and Bliss",
                "She Is a Haunting", "Pet")


class FablesClaim(BaseModel):
    book: str
    summarizer: str
    index: int = Field(description="position of the claim in its summary (the numeric key of the release)")
    claim: str
    label: FablesLabel
    evidence: list[str] = Field(default_factory=list, description="quotes from the book, as released")
    reason: list[str] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.book}|{self.summarizer}|{self.index}"


class FablesSummary(BaseModel):
    book: str
    summarizer: str
    summary: str
    general_comment: str = ""
    claims: list[FablesClaim] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# Reading


def _string_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BooklensError(f"malformed FABLES data {where} must be a list of strings")


def _comment(value: Any, where: str) -> str:
    """A summary's general comment: text (a list of lines is joined), or nothing."""
    if value is None:
        return ""
    return "\n".join(_string_list(value, where))


def parse_fables(data: Any, source: str = "FABLES data") -> list[FablesSummary]:
    """Records from the decoded JSON of a FABLES file; one clear error when the shape is wrong."""
    if isinstance(data, dict) and "FABLES" in data:
        data = data["FABLES"]
    if not isinstance(data, dict) or not data:
        raise BooklensError(f"{source} is not FABLES data: expected an object of book titles")
    summaries: list[FablesSummary] = []
    for book, by_model in data.items():
        if book == "canary":
            continue
        if not isinstance(by_model, dict):
            raise BooklensError(f"malformed FABLES data in {source}: book '{book}' must map summarizer names to summaries")
        for model, entry in by_model.items():
            where = f"{book} / {model}"
            if not isinstance(entry, dict) or not isinstance(entry.get("summary"), str) \
                    or not isinstance(entry.get("claims"), dict):
                raise BooklensError(f"malformed FABLES data in {source}: {where} needs 'summary' and 'claims'")
            claims: list[FablesClaim] = []
            keys = list(entry["claims"])
            if not all(key.isascii() and key.isdigit() for key in keys):
                raise BooklensError(f"malformed FABLES data in {source}: claim keys of {where} must be numbers "
                                    "(0, 1, 2, ...)")
            numbers = [int(key) for key in keys]
            if len(set(numbers)) != len(numbers):  # "1" and "01": one claim id for two claims
                twice = next(n for n in numbers if numbers.count(n) > 1)
                raise BooklensError(f"malformed FABLES data in {source}: {where} numbers two claims {twice}")
            for key in sorted(keys, key=int):
                raw = entry["claims"][key]
                if not isinstance(raw, dict) or not isinstance(raw.get("claim"), str) or not raw["claim"].strip():
                    raise BooklensError(f"malformed FABLES data in {source}: claim {key} of {where} has no text")
                label = raw.get("label")
                if label not in FABLES_LABEL_NAMES:
                    raise BooklensError(f"malformed FABLES data in {source}: claim {key} of {where} has label "
                                        f"{label!r} (expected one of {', '.join(FABLES_LABEL_NAMES)})")
                claims.append(FablesClaim(
                    book=book, summarizer=model, index=int(key), claim=raw["claim"], label=label,
                    evidence=_string_list(raw.get("evidence"), f"in {source}: evidence of claim {key} of {where}"),
                    reason=_string_list(raw.get("reason"), f"in {source}: reason of claim {key} of {where}"),
                ))
            summaries.append(FablesSummary(
                book=book, summarizer=model, summary=entry["summary"], claims=claims,
                general_comment=_comment(entry.get("general_comment"), f"in {source}: general_comment of {where}")))
    if not summaries:
        raise BooklensError(f"{source} holds no FABLES summaries")
    return summaries


def _read_bytes(path: Path) -> Any:
    from booklens.records import parse_json, read_file_bytes

    raw = read_file_bytes(path, "FABLES data")
    if zipfile.is_zipfile(io.BytesIO(raw)):
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = [n for n in archive.namelist() if n.endswith(".json") and not n.startswith("__MACOSX")]
            if not names:
                raise BooklensError(f"{path} is a zip archive without a JSON file")
            # Several JSON files: the release's own name decides; taking whichever is listed first
            # would read, say, a metadata file and report it as malformed FABLES data.
            release = [n for n in names if n.rsplit("/", 1)[-1] == "FABLES.json"]
            if len(names) > 1 and len(release) != 1:
                raise BooklensError(f"{path} holds {len(names)} JSON files ({', '.join(names)}) and not one "
                                    "FABLES.json: pass the FABLES.json itself with --data")
            member = release[0] if release else names[0]
            try:
                raw = archive.read(member)
            except RuntimeError as exc:  # encrypted members
                raise BooklensError(f"cannot read {member} from {path}: {exc}") from None
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                # Its directory reads but its bytes do not: a download cut short or spoiled.
                raise BooklensError(f"{path} is a damaged zip archive ({member}: {exc}); download "
                                    "FABLES.json.zip again") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BooklensError(f"{path} is not UTF-8 JSON") from None
    return parse_json(text, path, "FABLES data")


def load_fables(path: str | Path | None = None) -> list[FablesSummary]:
    """FABLES summaries from a .json (or the release's .json.zip, or the folder of FABLES.json);
    `default_fables_path()` when `path` is None."""
    if path is not None and not isinstance(path, (str, Path)):
        from booklens.inputs import as_path

        as_path(path, "the FABLES data", hint="split_summaries splits loaded summaries")
    path = found_fables_file(Path(path)) if path is not None else default_fables_path()
    return parse_fables(_read_bytes(path), str(path))


def fables_file(path: Path) -> Path:
    """The FABLES release a data path names: the file itself, or FABLES.json in the release's folder."""
    return path / "FABLES.json" if path.is_dir() else path


def found_fables_file(path: Path) -> Path:
    """`fables_file`, refused in one line when it is not there (a folder without FABLES.json)."""
    from booklens.records import present

    file = fables_file(path)
    if not present(file):
        raise BooklensError(f"FABLES data not found: {file}")
    return file


def default_fables_path() -> Path:
    """The FABLES release a command reads when given none: the shared copy beside the repository
    (`../shared/data/fables/FABLES.json`, next to BooookScore's data) if there is one, else the
    public release, downloaded once into the cache."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "fables" / "FABLES.json"
    return shared if shared.is_file() else download_fables()


def default_data_dir() -> Path:
    from booklens.lm import default_cache_dir

    return default_cache_dir() / "data" / "fables"


def download_fables(target_dir: str | Path | None = None, url: str = FABLES_URL, timeout: float = 30.0) -> Path:
    """The public FABLES release, downloaded once into the booklens cache; returns the JSON's path."""
    target = Path(target_dir) if target_dir is not None else default_data_dir()
    path = target / "FABLES.json"
    if path.exists():
        return path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BooklensError(f"cannot download FABLES from {url} ({reason}); offline? pass --data PATH "
                            "to a local FABLES.json") from None
    tmp = None
    try:
        target.mkdir(parents=True, exist_ok=True)
        # A name of its own: another command downloading into the same cache at once removes only its file.
        handle, name = tempfile.mkstemp(dir=target, prefix=".FABLES.", suffix=".download")
        tmp = Path(name)
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
        data = _read_bytes(tmp)
        parse_fables(data, url)  # only a file that loads is kept
        from booklens.records import save_json

        save_json(path, data)
    except OSError as exc:
        raise BooklensError(f"cannot store FABLES in {target}: {exc.strerror or exc}") from None
    finally:
        # The raw bytes are only a step towards FABLES.json; a download that did not load leaves none.
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------
# Examples and splits


def all_claims(summaries: Iterable[FablesSummary]) -> list[FablesClaim]:
    return [c for s in summaries for c in s.claims]


def decomposition_examples(summaries: Iterable[FablesSummary]) -> list:
    """summary -> the claims FABLES extracted from it (GPT-4 in the seed)."""
    import dspy

    return [dspy.Example(summary=s.summary, claims=[c.claim for c in s.claims], book=s.book,
                         summarizer=s.summarizer).with_inputs("summary") for s in summaries]


def verification_examples(summaries: Iterable[FablesSummary], *, labels: Sequence[str] | None = None) -> list:
    """claim + the annotator's evidence quotes -> the human label (booklens names).

    `labels` keeps only claims with these FABLES labels (e.g. ("Yes", "No") as in the seed's Table 5)."""
    import dspy

    from booklens.programs.faithfulness import clean_evidence
    from booklens.signatures.faithfulness import FABLES_LABELS

    out = []
    for claim in all_claims(summaries):
        if labels is not None and claim.label not in labels:
            continue
        out.append(dspy.Example(claim=claim.claim, evidence=clean_evidence(claim.evidence),
                                label=FABLES_LABELS[claim.label], book=claim.book, summarizer=claim.summarizer,
                                id=claim.id).with_inputs("claim", "evidence"))
    return out


def verification_demo(claim: FablesClaim) -> Any:
    """A FABLES claim as a complete labelled example of the verifier: its inputs (`claim`, and
    `passages` / `evidence`: the annotators' quotes, numbered) and every output field filled from
    the annotation: the label, the quotes as supporting (faithful) or refuting (unfaithful)
    passages, and the annotator's reason (or a plain one when they gave none)."""
    import dspy

    from booklens.programs.faithfulness import clean_evidence
    from booklens.retrieval import format_passages
    from booklens.signatures.faithfulness import FABLES_LABELS

    passages = clean_evidence(claim.evidence)
    label = FABLES_LABELS[claim.label]
    numbers = list(range(1, len(passages) + 1))
    reason = annotator_reason(claim)
    if not reason:
        reason = ("The passages show this." if label == "faithful" else "The passages contradict this.") \
            if passages else "The annotators judged it from the whole book."
    return dspy.Example(
        claim=claim.claim.strip(), passages=passages,
        evidence=format_passages(passages) if passages else "(no passages)",
        label=label, supporting_passages=numbers if label == "faithful" else [],
        refuting_passages=numbers if label == "unfaithful" else [], reason=reason,
        book=claim.book, summarizer=claim.summarizer, id=claim.id,
    ).with_inputs("claim", "passages")


def annotator_reason(claim: FablesClaim) -> str:
    """The annotator's reasons as one line of text ('' when they gave none)."""
    return " ".join(" ".join(r.split()) for r in claim.reason if r.strip())


def split_summaries(summaries: Sequence[FablesSummary], *, seed: int = DEFAULT_SEED,
                    fractions: dict[str, float] | None = None) -> dict[str, list[FablesSummary]]:
    """train / dev / test summaries, every book in exactly one split."""
    return split_by_book(list(summaries), key="book", seed=seed, fractions=fractions or DEFAULT_FRACTIONS)


def fables_splits(path: str | Path | None = None, *, seed: int = DEFAULT_SEED,
                  fractions: dict[str, float] | None = None, labels: Sequence[str] | None = None
                  ) -> dict[str, dict[str, list]]:
    """{split: {"decomposition": [...], "verification": [...]}} of `dspy.Example`s, split by book."""
    splits = split_summaries(load_fables(path), seed=seed, fractions=fractions)
    return {name: {"decomposition": decomposition_examples(items),
                   "verification": verification_examples(items, labels=labels)}
            for name, items in splits.items()}


# ---------------------------------------------------------------------------
# Statistics (the seed's Table 2)


def label_statistics(summaries: Sequence[FablesSummary]) -> dict[str, Any]:
    """Per summarizer (and overall): books, summaries, claims, mean and standard deviation of
    claims per summary, and the percentage of each label among its claims."""

    def block(items: list[FablesSummary]) -> dict[str, Any]:
        counts = [len(s.claims) for s in items]
        labels = [c.label for s in items for c in s.claims]
        total = len(labels)
        return {
            "books": len({s.book for s in items}),
            "summaries": len(items),
            "claims": total,
            "claims_per_summary_mean": round(statistics.mean(counts), 2) if counts else 0.0,
            # one summary has no spread, and no claims no shares: unknown (None), not 0
            "claims_per_summary_std": round(statistics.stdev(counts), 2) if len(counts) > 1 else None,
            "label_counts": {name: labels.count(name) for name in FABLES_LABEL_NAMES},
            "label_percentages": {name: (round(100.0 * labels.count(name) / total, 2) if total else None)
                                  for name in FABLES_LABEL_NAMES},
        }

    names = [m for m in SUMMARIZERS if any(s.summarizer == m for s in summaries)]
    names += sorted({s.summarizer for s in summaries} - set(names))
    return {
        "by_summarizer": {m: block([s for s in summaries if s.summarizer == m]) for m in names},
        "overall": block(list(summaries)),
    }


def format_statistics(stats: dict[str, Any]) -> str:
    """A plain-text table in the layout of the seed's Table 2."""
    cant = "Can't verify"
    header = f"{'Summarizer':<16}{'Summ.':>6}{'Claims':>8}{'Claims/summ. (std)':>20}" \
             f"{'Faithful':>10}{'Unfaithful':>12}{'Partial':>9}{cant:>14}"
    lines = [header, "-" * len(header)]

    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"

    rows = list(stats["by_summarizer"].items()) + [("Overall", stats["overall"])]
    for name, b in rows:
        p = b["label_percentages"]
        per = f"{b['claims_per_summary_mean']:.2f} ({f(b['claims_per_summary_std'])})"
        lines.append(f"{name:<16}{b['summaries']:>6}{b['claims']:>8}{per:>20}"
                     f"{f(p['Yes']):>10}{f(p['No']):>12}{f(p['PartialSupport']):>9}{f(p['Inapplicable']):>14}")
    return "\n".join(lines)
