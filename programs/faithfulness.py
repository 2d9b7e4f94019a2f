"""Faithfulness of a summary to its book (FABLES): decompose, retrieve, verify.

1. `ClaimDecomposer` splits the summary into atomic, self-contained claims.
2. For each claim the checker gathers evidence in one of the modes of
   `booklens.retrieval.EVIDENCE_MODES`: none, the evidence that came with the
   data (`given`, e.g. FABLES' human quotes), the top-k passages by BM25, dense
   or hybrid retrieval, or as much of the book as the budget holds (`book`).
3. `ClaimVerifier` labels each claim faithful / unfaithful / partial support /
   can't verify with a short reason and the numbers of the passages that
   support or contradict it. Claims are verified concurrently. With
   `label_set="binary"` it is the seed's Table 5 rater: faithful or unfaithful only.

A verdict does not claim more than its reason: when a four-way verdict says faithful,
unfaithful or partial support but its reason says the evidence does not settle the claim
("the passages do not mention ...", "cannot be verified"), the verdict is "can't verify"
(`settle_label`); the model's own label is kept in `model_label`. The binary rater has no
such state and keeps its label.

Labels come from a closed set: an answer outside it is re-asked (a fresh
sample) and, after the last try, recorded as a failure (`label=None`, `error`),
never replaced by a default. Every piece of evidence that could be placed in
the book carries its character offsets, so a verdict can be traced to the text.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, NamedTuple, Sequence

import dspy

from booklens.errors import BooklensError, setting_name
from booklens.lm import UNFINISHED, filter_stopped, last_stop, predict_with_retries, usage_step
from booklens.parallel import parallel_map
from booklens.programs.base import Module, Predict
from booklens.records import ClaimVerdict, Evidence
from booklens.retrieval import (BOOK_MODES, DEFAULT_K, EVIDENCE_MODES, MIN_BUDGET_TOKENS, MIN_PASSAGE_TOKENS, BookIndex,
                                format_passages)
from booklens.signatures.faithfulness import (
    LABEL_TO_FABLES,
    DecomposeSummary,
    VerifyClaim,
    VerifyClaimBinary,
    VerifyClaimBinaryWithoutEvidence,
    VerifyClaimWithoutEvidence,
)
from booklens.vocabulary import BINARY_LABELS, CANT_VERIFY, CLAIM_LABELS, DEFAULT_CONTEXT_WINDOW

DECOMPOSE_MAX_TOKENS = 2048
VERIFY_MAX_TOKENS = 256
# Tokens of the verification prompt other than the evidence (instructions, claim, field layout, chat template).
VERIFY_PROMPT_OVERHEAD = 1000
# Share of the remaining window evidence may fill: the backend's tokenizer may count more than cl100k_base.
BUDGET_MARGIN = 0.8
# Tokens a claim may take in the verification prompt, for the checks made before any claim is known.
CLAIM_ALLOWANCE = 64

# What annotators write when they have no quote; not evidence. A note says so in a few words
# ("no evidence to verify or refute", "Cannot verify", "No quotation."), and all of the field is the note.
_NO_EVIDENCE = re.compile(
    r"^\s*(n/?a|none|-+|not applicable|not true|no quotations?"
    r"|no evidence(?: (?:of|for|to (?:verify|support|refute)(?: or (?:verify|support|refute))?)"
    r"(?: (?:this|it|the claim))?(?: in the (?:book|text))?)?"
    r"|(?:can ?not|can'?t|can\u2019t) (?:verify|be verified)(?: or refute)?(?: (?:this|it))?)?\.?\s*$",
    re.IGNORECASE)
# A list marker or number before a claim: "-", "1.", "(1)", "[1]", "1:", "Claim 2:", "Claim #4 -". A
# number may be bold ("**1.**") or touch the claim's first letter ("1.Anna"); one touching a digit
# ("1.5 million", "10:30") is the claim's own.
_BULLET = re.compile(r"^\s*(?:(?:\*\*|__)?\d+[.):](?:\*\*|__)?(?:\s+|(?=[^\W\d_]))"
                     r"|(?:[-*\u2022]+|\(\d+\)|\[\d+\]|claim\s*#?\d+\s*[-.:)\u2013\u2014]?)\s+)",
                     re.IGNORECASE)


def clean_evidence(quotes: Sequence[str] | None) -> list[str]:
    """Quotes that carry text (drops empty strings and placeholders such as 'N/A' or 'None')."""
    return [q.strip() for q in quotes or [] if isinstance(q, str) and not _NO_EVIDENCE.match(q)]


def first_without_quotes(given: Sequence[Sequence[str] | None] | None, count: int) -> int | None:
    """The first of `count` claims whose evidence holds no quote (no list, an empty one, or only blanks
    and placeholders such as 'N/A'), else None: in the 'given' mode the judge would read nothing."""
    lists = list(given or [])
    return next((i for i in range(count) if i >= len(lists) or not clean_evidence(lists[i])), None)


_WORD = re.compile(r"[^\W\d_][\w'\u2019-]*")
# A fragment of this many words or fewer, every one capitalized, is a name or a title.
NAME_WORDS = 4


def asserts_something(text: str) -> bool:
    """Whether a claim states something. A bare name or title ("Daniel Pike", "Chapter One")
    does not: it has at most NAME_WORDS words and all of them start with a capital letter."""
    words = _WORD.findall(text)
    # A letter without case (Han, kana, Arabic) is no capital: such a script writes no names so.
    return bool(words) and (len(words) > NAME_WORDS or not all(w[0].isupper() for w in words))


_QUOTES = '"\u201c\u201d'


def _unwrap(text: str) -> str:
    """`text` without a pair of double quotes around all of it. Quotes that open or close a
    quotation from the book inside the claim stay: with more quotes in between, the first and
    last marks may not be one pair, and stripping them would leave the quotation unbalanced."""
    if len(text) >= 2 and text[0] in '"\u201c' and text[-1] in '"\u201d' \
            and not any(q in text[1:-1] for q in _QUOTES):
        return text[1:-1].strip()
    return text


def clean_claims(raw: Sequence[Any]) -> list[str]:
    """Claims as plain sentences: list markers and quotes around a whole claim stripped, items
    without a word and repeats dropped, and fragments that state nothing (`asserts_something`)
    dropped from a list that has claims. A list of nothing but fragments is kept as it is. A small
    model writes such lists for a few summaries on every try, and a run with something to verify
    beats one that stops at this step."""
    from booklens.inputs import claim_key
    from booklens.text import has_words

    claims: list[str] = []
    seen: set[str] = set()
    for item in raw or []:
        # a number may sit inside the quotes ('"1. Anna sails."') as well as before them
        text = _BULLET.sub("", _unwrap(_BULLET.sub("", str(item)).strip())).strip()
        key = claim_key(text)
        if has_words(text) and key not in seen:
            seen.add(key)
            claims.append(text)
    statements = [c for c in claims if asserts_something(c)]
    return statements or claims


def evidence_budget(context_window: int | None, max_tokens: int = VERIFY_MAX_TOKENS, demo_tokens: int = 0) -> int:
    """Tokens of evidence a verification prompt may hold in a model's context window, next to the
    instructions, the claim, the answer and `demo_tokens` of few-shot demos."""
    window = context_window or DEFAULT_CONTEXT_WINDOW
    return max(256, int((window - max_tokens - VERIFY_PROMPT_OVERHEAD - demo_tokens) * BUDGET_MARGIN))


def evidence_room(verifier: "ClaimVerifier", context_window: int, passages: int = 1, margin: float = 1.0) -> int:
    """Tokens of evidence one verification prompt of `verifier` holds in a `context_window`-token window:
    what the window leaves beside the answer budget, the prompt's instructions and demos as they are
    sent (measured, with the headers of `passages` passages) and a claim. The checks refuse only what
    cannot fit in cl100k_base tokens (`margin` 1); the values they advise keep `BUDGET_MARGIN` of the
    window for a server's tokenizer that counts more, so that they fit there too."""
    from booklens.programs.base import prompt_tokens

    fixed = prompt_tokens(verifier.verify, evidence=format_passages([""] * max(passages, 1)), claim="")
    return int((context_window - verifier.max_tokens) * margin) - fixed - CLAIM_ALLOWANCE


def _no_room(bare: "ClaimVerifier", context_window: int, passages: int, least: int, shown: int = 0) -> str | None:
    """The line for a window in which the judge's prompt without demos (`bare`, with the headers of
    `passages` passages) leaves less than the `least` evidence any setting asks, naming the least
    window that holds the `shown` tokens of evidence the settings bring (at least `least`), kept to
    `BUDGET_MARGIN` as the values the checks advise."""
    if evidence_room(bare, context_window, passages, BUDGET_MARGIN) >= least:
        return None
    least = max(least, shown)
    # evidence_room grows with the window, by BUDGET_MARGIN a token: a first guess, then the exact one
    needed = context_window + math.ceil(
        (least - evidence_room(bare, context_window, passages, BUDGET_MARGIN)) / BUDGET_MARGIN)
    while evidence_room(bare, needed - 1, passages, BUDGET_MARGIN) >= least:
        needed -= 1
    while evidence_room(bare, needed, passages, BUDGET_MARGIN) < least:
        needed += 1
    return (f"the judge's {context_window}-token context window holds no evidence beside its answer and its "
            f"prompt's instructions; use a model or server with a context window of {needed:,} tokens or more")


def window_holds_no_evidence(verifier: "ClaimVerifier", context_window: int, *, mode: str, k: int,
                             passage_tokens: int) -> str | None:
    """The line `fit_demos_to_evidence` refuses a `context_window`-token window with when `verifier`'s
    prompt without demos leaves less evidence there than any setting asks (`_no_room`), whatever the
    other settings; else None. For a window a server named in refusing a prompt (llama-cpp-python's
    states none beforehand): no `--context-window` or evidence setting makes the judge fit it."""
    from booklens.retrieval import BUDGET_MODES, PASSAGE_MODES

    bare = _showing(verifier, 0)
    if mode in PASSAGE_MODES:
        return _no_room(bare, context_window, k, MIN_PASSAGE_TOKENS, k * passage_tokens)
    if mode in BUDGET_MODES:
        return _no_room(bare, context_window, 1, MIN_BUDGET_TOKENS)
    return None


def _showing(verifier: "ClaimVerifier", count: int) -> "ClaimVerifier":
    """`verifier` itself when `count` is all its demos, else a copy that shows only the first `count`:
    the caller's verifier may judge other books (or windows) that hold more."""
    if count == len(verifier.verify.demos):
        return verifier
    import copy

    # Only the predictor's demos differ: the rest (its signature, the other predictor) is shared.
    fitted = copy.copy(verifier)
    fitted.verify = copy.copy(verifier.verify)
    fitted.verify.demos = list(verifier.verify.demos[:count])
    return fitted


def _most_demos(verifier: "ClaimVerifier", context_window: int, need: int, passages: int = 1) -> int | None:
    """The most of `verifier`'s demos, counted from the first, beside which `need` tokens of evidence
    fit one verification prompt (`evidence_room`, checked as the refusals check it); None when not even
    with none. All of them are known not to fit."""
    for count in range(len(verifier.verify.demos) - 1, -1, -1):
        if need <= evidence_room(_showing(verifier, count), context_window, passages):
            return count
    return None


class DemoFit(NamedTuple):
    """The verifier to judge with (`fit_demos_to_evidence`): the one given when all its demos fit,
    else a copy showing `shown` of them, with the line that says so (`note`)."""
    verifier: "ClaimVerifier"
    shown: int | None = None
    note: str | None = None


def _fewer_demos(verifier: "ClaimVerifier", context_window: int, count: int, beside: str) -> DemoFit:
    return DemoFit(_showing(verifier, count), count,
                   f"the judge is shown {count} of its {len(verifier.verify.demos)} demos: its {context_window}-token "
                   f"context window holds no more beside {beside}")


def fit_passages(verifier: "ClaimVerifier", context_window: int | None, *, k: int, passage_tokens: int,
                 book_text: str | None = None, as_keys: bool | str = False) -> DemoFit:
    """The verifier whose prompt holds the top `k` passages of up to `passage_tokens` tokens in a
    `context_window`-token window (`evidence_room`): `verifier` when it does with all its demos, else
    one that shows the longest prefix of them that leaves room (as the coherence judge drops demos).
    A one-line `BooklensError` when the passages fit beside no demo: every call would fail with the
    server's "prompt does not fit", which names neither setting; the values it names fit beside none.
    A book shorter than that is all the evidence any k brings. No window figure (a remote model
    LiteLLM does not know), no check."""
    if not context_window:
        return DemoFit(verifier)
    shown = k * passage_tokens
    if shown <= evidence_room(verifier, context_window, k):
        return DemoFit(verifier)
    if book_text is not None:
        from booklens.text import count_tokens

        shown = min(shown, count_tokens(book_text))  # counted only here: a whole book takes a moment
        if shown <= evidence_room(verifier, context_window, k):
            return DemoFit(verifier)
    count = _most_demos(verifier, context_window, shown, k)
    if count is not None:
        return _fewer_demos(verifier, context_window, count, f"{k} passages of up to {passage_tokens} tokens")
    room = evidence_room(_showing(verifier, 0), context_window, k, BUDGET_MARGIN)
    no_room = _no_room(_showing(verifier, 0), context_window, k, MIN_PASSAGE_TOKENS, shown)
    if no_room:
        raise BooklensError(no_room)
    k_name, size_name = setting_name("--k", as_keys), setting_name("--passage-tokens", as_keys)
    # The values that fit, each with the other setting as it is, so that no rerun has to search.
    fits = [f"{k_name} to {room // passage_tokens} or less"] if room >= passage_tokens else []
    if room // k >= MIN_PASSAGE_TOKENS:
        fits.append(f"{size_name} to {room // k} or less")
    if not fits:
        fits = [f"{k_name} to 1 and {size_name} to {room} or less"]
    raise BooklensError(f"{k_name} {k} passages of up to {size_name} {passage_tokens} tokens: {shown} tokens of "
                        f"evidence per claim, more than the {room} that fit beside the judge's answer and "
                        f"prompt in its {context_window}-token context window; lower {' or '.join(fits)}")


def fit_budget(verifier: "ClaimVerifier", context_window: int | None, *, budget_tokens: int | None,
               book_text: str | None = None, given: Sequence[Sequence[str] | None] | None = None,
               as_keys: bool | str = False) -> DemoFit:
    """`fit_passages` for the budget of the `book` and `given` modes: the verifier whose prompt holds an
    explicit `budget_tokens` of evidence, or a one-line `BooklensError` when it fits beside no demo.
    The whole book (`book_text`) is the most any budget brings; in the `given` mode each claim's own
    quotes (`given`, one list per claim) are, and the error names the first claim whose quotes the
    budget lets past the window. No budget (the window's own, `evidence_budget`) or no window figure,
    no check."""
    if not context_window or budget_tokens is None:
        return DemoFit(verifier)
    room = evidence_room(verifier, context_window)
    shown = budget_tokens
    if shown <= room:
        return DemoFit(verifier)
    sizes = None
    if given is not None:
        from booklens.text import count_tokens

        # as `FaithfulnessChecker._given` shows them: the cleaned quotes, cut at the budget
        sizes = [min(budget_tokens, sum(count_tokens(q) for q in clean_evidence(quotes))) for quotes in given]
        shown = max(sizes, default=0)
        if shown <= room:
            return DemoFit(verifier)
    elif book_text is not None:
        from booklens.text import count_tokens

        shown = min(shown, count_tokens(book_text))
        if shown <= room:
            return DemoFit(verifier)
    count = _most_demos(verifier, context_window, shown)
    if count is not None:
        return _fewer_demos(verifier, context_window, count, f"up to {shown} tokens of evidence per claim")
    bare = _showing(verifier, 0)
    whose = ""
    if sizes is not None:
        bare_room = evidence_room(bare, context_window)  # less than the longest quotes: `_most_demos` found none
        first = next(i for i, size in enumerate(sizes) if size > bare_room)
        whose = f"claim {first + 1}'s evidence is {sizes[first]} tokens"
    room = evidence_room(bare, context_window, margin=BUDGET_MARGIN)
    no_room = _no_room(bare, context_window, 1, MIN_BUDGET_TOKENS, shown)
    if no_room:
        raise BooklensError(no_room)
    name = setting_name("--budget-tokens", as_keys)
    raise BooklensError(f"{name} {budget_tokens}: {whose or f'{shown} tokens of evidence per claim'}, more than the "
                        f"{room} that fit beside the judge's answer and prompt in its {context_window}-token "
                        f"context window; lower {name} to {room} or less, or leave it out (the default is what "
                        "the window holds)")


def fit_demos_to_evidence(verifier: "ClaimVerifier", context_window: int | None, *, mode: str, k: int,
                          passage_tokens: int, budget_tokens: int | None = None, book_text: str | None = None,
                          given: Sequence[Sequence[str] | None] | None = None, as_keys: bool | str = False) -> DemoFit:
    """The verifier that judges in evidence `mode` with these settings in a `context_window`-token window,
    checked before any call: `fit_passages` for the passage modes, `fit_budget` for `book` and `given`.
    Every command and a sweep's driver and cells decide by this rule alone, so the same settings, book
    and window always show the judge the same demos. `verifier` itself is never changed."""
    from booklens.retrieval import BUDGET_MODES, PASSAGE_MODES

    if mode in PASSAGE_MODES:
        return fit_passages(verifier, context_window, k=k, passage_tokens=passage_tokens, book_text=book_text,
                            as_keys=as_keys)
    if mode in BUDGET_MODES:
        return fit_budget(verifier, context_window, budget_tokens=budget_tokens, book_text=book_text,
                          given=given if mode == "given" else None, as_keys=as_keys)
    return DemoFit(verifier)


# ---------------------------------------------------------------------------
# Verdicts that do not overclaim

LABEL_SETS: dict[str, tuple[str, ...]] = {"four-way": CLAIM_LABELS, "binary": BINARY_LABELS}

# The reason says outright that the claim cannot be decided from what was given.
_ADVERB = r"(?:\s+(?:really|fully|completely|entirely|directly|clearly|definitively|reliably|actually))?"
_UNDECIDED = re.compile(
    r"\b(?:can ?not|can't|cannot|could ?not|couldn't|unable to|impossible to|not possible to|isn't possible to"
    r"|no way to)" + _ADVERB + r"\s+(?:be" + _ADVERB + r"\s+)?"
    r"(?:verif|confirm|determin|tell|decid|assess|judg|establish|find (?:any |the |where )?(?:support|evidence)"
    r"|grasp|provide (?:any )?evidence)"
    r"|\b(?:not|never)" + _ADVERB + r"\s+(?:be\s+)?(?:verifiable|verified|confirmed|determined|decided|established)\b"
    r"|\bunverifiable\b"
    r"|\bneither\s+(?:supports?|confirms?)\s+nor\s+(?:contradicts?|refutes?|denies?)"
    r"|\b(?:does|do|did)\s*(?:n't|\s+not)\s+(?:support|confirm)\s+(?:or|nor)\s+(?:contradict|refute|deny)",
    re.IGNORECASE)
# The reason says the evidence lacks what would support the claim: "can't verify" for a faithful
# verdict, but what a partial support says of the part that goes beyond the evidence.
_LACKS_EVIDENCE = re.compile(
    r"\b(?:not|no|insufficient|in ?adequate|lack of|lacks?|without)\s+(?:enough\s+|sufficient\s+|any\s+|relevant\s+"
    r"|clear\s+|direct\s+)?(?:information|evidence|context|details?|support)\b",
    re.IGNORECASE)
# The reason says the evidence goes against the claim: an unfaithful verdict that says so stands,
# whatever else its reason says is missing.
_CONTRADICTED = re.compile(
    r"\b(?:false|untrue|not true|incorrect|inaccurate|wrong|mistaken|contradict\w*|refut\w*|opposite|contrary)\b"
    r"|\b(?:never|not)\s+(?:happens?|happened|occurs?|occurred)\b",
    re.IGNORECASE)
# The reason says the evidence is silent about the claim.
_SILENT = re.compile(
    r"\b(?:passages?|evidence|context|text|book|excerpts?|quotes?|story)\b[^.;]{0,40}?"
    r"\b(?:does|do|did)\s*(?:n't|\s+not)\s+(?:mention|say|state|address|discuss|describe|refer|show|indicate|specify)"
    r"|\b(?:is|are|was|were)\s+not\s+(?:mentioned|stated|addressed|discussed|described|specified|shown)\b"
    r"|\bno\s+(?:mention|references?)\b|\bnothing\s+(?:in|about)\b",
    re.IGNORECASE)


# The reason cites the evidence for the claim: "passage 2 says", "[1] confirms", "the text shows",
# "as stated in passage 3". What such a reason says is missing or absent is another thing than the
# claim (a cause it does not name, the story's own "no support from her family").
_CITES = re.compile(
    r"(?:\bpassages?\s*\[?\d+\]?(?:\s*(?:,|and|&)\s*\[?\d+\]?)*|\[\d+\]"
    r"|\bthe\s+(?:passages?|text|evidence|excerpts?|quotes?|book|story))"
    r"\s+(?:(?:also|clearly|directly|explicitly|plainly|itself|both)\s+)?"
    r"(?:says?|states?|shows?|confirms?|supports?|describes?|mentions?|implies|indicates?|notes?|explains?"
    r"|reveals?|depicts?|establishes|recounts?|narrates?)\b(?!\s+(?:nothing|no|none|neither|not|never)\b)"
    r"|\b(?:stated|shown|confirmed|supported|described|mentioned|established|implied)\s+"
    r"(?:directly\s+|explicitly\s+|clearly\s+)?(?:in|by)\s+(?:passages?\s*\[?\d+|\[\d+\])",
    re.IGNORECASE)
# After a citation, a clause saying the evidence ("it", "they", "the passages") does not say something
# speaks of the rest of the claim. "No mention of another cause" or "nothing in the passages
# contradicts it" there does not: those name no part of the claim as missing.
_NOT_SAID = re.compile(
    r"\b(?:does|do|did)\s*(?:n't|\s+not)\s+(?:mention|say|state|address|discuss|describe|refer|show|indicate"
    r"|specify)\b|\b(?:is|are|was|were)\s+not\s+(?:mentioned|stated|addressed|discussed|described|specified|shown)\b",
    re.IGNORECASE)
_NEGATED = re.compile(r"\b(?:not|no|never|nothing|none|neither|nor|without)\b|n't\b", re.IGNORECASE)
# Where one clause of a reason ends and the next begins ("Passage 1 mentions Lisbon, but whether ...").
_CLAUSE = re.compile(r"[.;:!?](?:\s+|$)|,?\s+(?:but|although|though|however|whereas)\b,?\s*", re.IGNORECASE)


def _cites_support(clause: str) -> bool:
    """Whether a clause cites a passage or the text as saying something, not negated around it
    ("Nothing in passage 1 states ...", "passage 1 says nothing about ..." cite nothing)."""
    return any(not _NEGATED.search(clause[:m.start()].rsplit(",", 1)[-1]) for m in _CITES.finditer(clause))


def speaks_of_unsettled_evidence(reason: str, label: str) -> bool:
    """Whether a reason speaks of the evidence as not settling the claim, lacking support for it, or
    (but for partial support) silent on it. Stricter than `settle_label`, which lets a stated
    contradiction stand: a demo's reason must not use such words unless its label is can't verify,
    so that the demos teach one reading."""
    return bool(_UNDECIDED.search(reason) or _LACKS_EVIDENCE.search(reason)
                or (label != "partial support" and _SILENT.search(reason)))


def settle_label(label: str | None, reason: str, label_set: str = "four-way") -> tuple[str | None, str | None]:
    """(the verdict's label, why it differs from the model's) for a four-way verdict.

    A reason that says the claim cannot be decided makes any label "can't verify"; a reason that says
    the evidence lacks support for the claim, or is silent about it, does so for faithful and
    unfaithful (partial support legitimately says part of the claim goes beyond the evidence). An
    unfaithful verdict whose reason says the evidence goes against the claim stands. A reason that
    cites a passage for the claim (`_cites_support`) keeps a partial support unless a clause before
    the citation says the claim cannot be decided, and keeps a faithful verdict unless a clause
    after the citation says the claim cannot be decided, or that the evidence lacks it or does not
    say it. Binary verdicts are kept."""
    if label is None or label == CANT_VERIFY or label_set != "four-way" or not reason:
        return label, None
    if label == "unfaithful" and _CONTRADICTED.search(reason):
        return label, None
    clauses = [c for c in _CLAUSE.split(reason) if c.strip()]
    citing = [_cites_support(c) for c in clauses]
    if label == "unfaithful":
        unsettled = _UNDECIDED.search(reason) or _LACKS_EVIDENCE.search(reason) or _SILENT.search(reason)
    elif label == "partial support":
        # "Passage 1 supports the voyage, but the date cannot be verified" is what partial support
        # means; "The claim cannot be verified; passage 1 is about ..." is not.
        first = citing.index(True) if any(citing) else len(clauses)
        unsettled = any(_UNDECIDED.search(c) for c in clauses[:first])
    elif any(citing):
        # What comes after the last citation qualifies it.
        last = max(i for i, cites in enumerate(citing) if cites)
        unsettled = any(_UNDECIDED.search(c) or _LACKS_EVIDENCE.search(c) or _NOT_SAID.search(c)
                        for c in clauses[last + 1:])
    else:
        unsettled = _UNDECIDED.search(reason) or _LACKS_EVIDENCE.search(reason) or _SILENT.search(reason)
    if unsettled:
        return CANT_VERIFY, f"the model answered '{label}' but its reason says the evidence does not settle the claim"
    return label, None


def label_summary(verdicts: Sequence[ClaimVerdict]) -> tuple[dict[str, int], dict[str, float], int]:
    """Counts of each label (failed verifications as 'failed'), the percentage of each label among
    the verified claims (none when no claim was verified: the shares are unknown, not 0% of every
    label), and the number of claims left unverified.

    A claim without a valid label is left out of the percentages, as BooookScore leaves out a
    sentence without a valid verdict: a judge that failed says nothing about the summary, and
    counting its failures against every label would read as an unfaithful system."""
    counts = {label: 0 for label in CLAIM_LABELS}
    counts["failed"] = 0
    for v in verdicts:
        counts[v.label if v.label is not None else "failed"] += 1
    return counts, label_shares_of(counts, digits=2), counts["failed"]


def label_shares_of(counts: Mapping[str, int], digits: int | None = None) -> dict[str, float]:
    """The percentage of each label among the verified claims of `counts` (as `label_summary`
    counts them), rounded to `digits` for display or exact for averaging; {} when none was verified."""
    verified = sum(counts.get(label, 0) for label in CLAIM_LABELS)
    if not verified:
        return {}
    shares = {label: 100.0 * counts.get(label, 0) / verified for label in CLAIM_LABELS}
    return {label: round(share, digits) for label, share in shares.items()} if digits is not None else shares


# ---------------------------------------------------------------------------
# Decomposition


class ClaimDecomposer(Module):
    """Summary -> atomic claims."""

    def __init__(self, *, tries: int = 3, max_tokens: int = DECOMPOSE_MAX_TOKENS):
        super().__init__()
        from booklens.parallel import check_at_least

        check_at_least("tries", tries)
        self.decompose = Predict(DecomposeSummary)
        self.tries = tries
        self.max_tokens = max_tokens

    def forward(self, summary: str) -> dspy.Prediction:
        from booklens.inputs import summary_text

        summary = summary_text(summary)

        def check(prediction) -> str | None:
            stop = last_stop()
            if stop is not None:
                return f"the list of claims was {UNFINISHED[stop]}"
            if not clean_claims(prediction.claims):
                return "no claims in the answer"
            return None

        from booklens.text import count_tokens

        # The claims restate the summary, so they need about as many tokens as it has; the cap keeps a
        # model that repeats itself from running on to the full limit.
        max_tokens = min(self.max_tokens, 2 * count_tokens(summary) + 256)
        attempted = predict_with_retries(self.decompose, tries=self.tries, check=check,
                                         config={"max_tokens": max_tokens}, summary=summary.strip())
        if not attempted.ok:
            return dspy.Prediction(claims=[], attempts=attempted.attempts, error=attempted.error)
        return dspy.Prediction(claims=clean_claims(attempted.prediction.claims), attempts=attempted.attempts,
                               error=None)


# ---------------------------------------------------------------------------
# Verification


def _passage_numbers(values: Any, count: int) -> tuple[list[int], list[int]]:
    """(valid numbers in 1..count, numbers out of range), each sorted without repeats."""
    valid, invalid = set(), set()
    for value in values or []:
        try:
            n = int(value)
        except (TypeError, ValueError):
            continue
        (valid if 1 <= n <= count else invalid).add(n)
    return sorted(valid), sorted(invalid)


class ClaimVerifier(Module):
    """Claim + evidence passages -> label, reason, supporting and refuting passage numbers.

    `passages=None` asks without evidence (the 'none' mode); a list (possibly empty) is the evidence.
    `label_set` is "four-way" (FABLES' four labels) or "binary" (faithful / unfaithful)."""

    def __init__(self, *, tries: int = 3, max_tokens: int = VERIFY_MAX_TOKENS, label_set: str = "four-way"):
        super().__init__()
        from booklens.parallel import check_at_least

        check_at_least("tries", tries)
        if label_set not in LABEL_SETS:
            raise BooklensError(f"unknown label set '{label_set}' (use one of {', '.join(LABEL_SETS)})")
        binary = label_set == "binary"
        self.verify = Predict(VerifyClaimBinary if binary else VerifyClaim)
        self.verify_without_evidence = Predict(VerifyClaimBinaryWithoutEvidence if binary
                                                    else VerifyClaimWithoutEvidence)
        self.tries = tries
        self.max_tokens = max_tokens
        self.label_set = label_set

    @property
    def labels(self) -> tuple[str, ...]:
        return LABEL_SETS[self.label_set]

    def check(self, prediction) -> str | None:
        label = getattr(prediction, "label", None)
        if label not in self.labels:
            return f"label {label!r} is not one of {', '.join(self.labels)}"
        return None

    def demo_tokens(self) -> int:
        """cl100k tokens of the demos shown with evidence (counted once: they do not change per claim)."""
        from booklens.text import count_tokens

        total = 0
        for demo in self.verify.demos:
            text = " ".join(str(demo.get(k, "")) for k in self.verify.signature.fields)
            total += count_tokens(text) + 40  # field headers, JSON keys, chat turns
        return total

    def evidence_budget(self, context_window: int | None) -> int:
        """Evidence tokens one verification prompt of this verifier may hold on an LM with this context
        window (the 'book' mode's budget when none is given); a sweep's `--dry-run` sizes it the same way."""
        return evidence_budget(context_window, self.max_tokens, self.demo_tokens())

    def forward(self, claim: str, passages: Sequence[str] | None = None) -> dspy.Prediction:
        config = {"max_tokens": self.max_tokens}
        finish: dict[str, str | None] = {}

        def check(prediction) -> str | None:
            finish["reason"] = last_stop()
            # What the filter withheld may be the reason, the passage lists or the label's own words:
            # no finished verdict, so it is asked again and, failing that, recorded as failed.
            return self.check(prediction) or filter_stopped("verdict")

        if passages is None:
            attempted = predict_with_retries(self.verify_without_evidence, tries=self.tries, check=check,
                                             config=config, claim=claim)
        else:
            evidence = format_passages(passages) if passages else "(no passages)"
            attempted = predict_with_retries(self.verify, tries=self.tries, check=check, config=config,
                                             evidence=evidence, claim=claim)
        if not attempted.ok:
            return dspy.Prediction(label=None, model_label=None, relabelled=None, reason="", supporting=[],
                                   refuting=[], invalid_references=[], truncated=False, attempts=attempted.attempts,
                                   error=attempted.error)
        p = attempted.prediction
        count = len(passages or [])
        supporting, bad_s = _passage_numbers(getattr(p, "supporting_passages", None), count)
        refuting, bad_r = _passage_numbers(getattr(p, "refuting_passages", None), count)
        # A label that parsed is kept when the answer ran into the token limit (small models sometimes
        # count on through the passage lists); the cut-off lists are not evidence of anything.
        truncated = finish.get("reason") == "length"
        if truncated:
            supporting, refuting, bad_s, bad_r = [], [], [], []
        reason = str(p.reason or "").strip()
        label, relabelled = settle_label(p.label, reason, self.label_set)
        return dspy.Prediction(label=label, model_label=p.label if relabelled else None, relabelled=relabelled,
                               reason=reason, supporting=supporting,
                               refuting=refuting, invalid_references=sorted(set(bad_s) | set(bad_r)),
                               truncated=truncated, attempts=attempted.attempts, error=None)


# ---------------------------------------------------------------------------
# The whole chain


class FaithfulnessChecker(Module):
    """Decompose a summary (unless claims are given), gather evidence per claim, verify concurrently."""

    def __init__(self, decomposer: ClaimDecomposer | None = None, verifier: ClaimVerifier | None = None, *,
                 evidence_mode: str = "bm25", k: int = DEFAULT_K, budget_tokens: int | None = None,
                 concurrency: int = 4):
        super().__init__()
        if evidence_mode not in EVIDENCE_MODES:
            raise BooklensError(f"unknown evidence mode '{evidence_mode}' (use one of {', '.join(EVIDENCE_MODES)})")
        if k < 1:
            raise BooklensError("k must be at least 1")
        from booklens.parallel import check_at_least

        check_at_least("--concurrency", concurrency)
        if budget_tokens is not None:
            check_at_least("--budget-tokens", budget_tokens, MIN_BUDGET_TOKENS)
        self.decomposer = decomposer or ClaimDecomposer()
        self.verifier = verifier or ClaimVerifier()
        self.evidence_mode = evidence_mode
        self.k = k
        self.budget_tokens = budget_tokens
        self.concurrency = concurrency

    def resolved_budget(self) -> int:
        """Evidence tokens per verification: the given budget or what the LM's window holds."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        return self.verifier.evidence_budget(getattr(dspy.settings.lm, "context_window", None))

    # -- evidence -----------------------------------------------------------------

    def gather(self, claim: str, index: BookIndex | None, given: Sequence[str] | None = None) -> list[Evidence] | None:
        """The evidence for one claim (None in the 'none' mode)."""
        mode = self.evidence_mode
        if mode == "none":
            return None
        if mode == "given":
            return self._given(given or [], index)
        if index is None:
            raise BooklensError(f"evidence mode '{mode}' needs a book")
        if mode == "book":  # the budget holds the passages as the verifier reads them, numbered
            passages = index.book_context_as(claim, self.resolved_budget(),
                                             lambda shown: format_passages(p.text for p in shown))
            return [Evidence(number=n, text=p.text, source="book", passage=p.index, start=p.start, end=p.end)
                    for n, p in enumerate(passages, start=1)]
        hits = index.search(claim, mode=mode, k=self.k)
        return [Evidence(number=n, text=p.text, source=mode, passage=p.index, start=p.start, end=p.end,
                         score=round(score, 6)) for n, (p, score) in enumerate(hits, start=1)]

    def _given(self, quotes: Sequence[str], index: BookIndex | None) -> list[Evidence]:
        from booklens.text import count_tokens, truncate_to_words

        budget = self.resolved_budget()
        evidence: list[Evidence] = []
        shown: list[str] = []
        # Counted as the verifier reads them: numbered and apart, which the quotes' own tokens leave out.
        for quote in clean_evidence(quotes):
            if count_tokens(format_passages([*shown, quote])) > budget:
                room = budget - count_tokens(format_passages([*shown, ""]))  # what the next label leaves
                if room < 32:
                    break
                quote = truncate_to_words(quote, room)
                while quote and count_tokens(format_passages([*shown, quote])) > budget:
                    quote = truncate_to_words(quote, count_tokens(quote) - 1)  # a word joined across the cut
                if not quote:
                    break
            shown.append(quote)
            item = Evidence(number=len(evidence) + 1, text=quote, source="given")
            if index is not None:
                span = index.locate(quote)
                if span is not None:
                    item.start, item.end = span
                    overlapping = index.passages_overlapping(*span)
                    item.passage = overlapping[0].index if overlapping else None
            evidence.append(item)
        return evidence

    # -- running ------------------------------------------------------------------

    def verify_claims(self, claims: Sequence[str], *, index: BookIndex | None = None,
                      given_evidence: Sequence[Sequence[str]] | None = None) -> list[ClaimVerdict]:
        mode = self.evidence_mode
        if mode in BOOK_MODES and index is None:
            raise BooklensError(f"evidence mode '{mode}' needs a book")
        if mode == "given":
            if given_evidence is None:
                raise BooklensError("evidence mode 'given' needs evidence quotes with every claim")
            if len(given_evidence) != len(claims):
                raise BooklensError(f"{len(claims)} claims but {len(given_evidence)} evidence lists")
        if index is not None and claims and index.needs_dense(mode, self.resolved_budget() if mode == "book" else None):
            index.ensure_dense()  # build once here rather than inside the first worker
        evidence = [self.gather(c, index, given_evidence[i] if given_evidence is not None else None)
                    for i, c in enumerate(claims)]

        def run(i: int) -> ClaimVerdict:
            items = evidence[i]
            result = self.verifier(claim=claims[i], passages=None if items is None else [e.text for e in items])
            for e in items or []:
                e.supports = e.number in result.supporting
                e.refutes = e.number in result.refuting
            return ClaimVerdict(
                index=i, claim=claims[i], label=result.label,
                fables_label=LABEL_TO_FABLES.get(result.label) if result.label else None,
                model_label=result.model_label, relabelled=result.relabelled, reason=result.reason, evidence=items or [], supporting=result.supporting, refuting=result.refuting,
                invalid_references=result.invalid_references, truncated=result.truncated,
                attempts=result.attempts, error=result.error,
            )

        with usage_step("verify"):
            return parallel_map(run, range(len(claims)), concurrency=self.concurrency, desc="verifying claims")

    def claims_of(self, summary: str) -> list[str]:
        """The summary's atomic claims, counted under the `decompose` usage step; a one-line
        error when the decomposer gives up."""
        with usage_step("decompose"):
            decomposed = self.decomposer(summary=summary)
        if decomposed.error:
            raise BooklensError(f"could not split the summary into claims ({decomposed.attempts} tries): "
                                f"{decomposed.error}")
        return list(decomposed.claims)

    def forward(self, summary: str | None = None, *, claims: Sequence[str] | None = None,
                index: BookIndex | None = None, given_evidence: Sequence[Sequence[str]] | None = None
                ) -> dspy.Prediction:
        if claims is None:
            if summary is None:
                raise BooklensError("give a summary or a list of claims")
            claims = self.claims_of(summary)
        verdicts = self.verify_claims(list(claims), index=index, given_evidence=given_evidence)
        counts, percentages, failures = label_summary(verdicts)
        return dspy.Prediction(claims=verdicts, label_counts=counts, label_percentages=percentages,
                               failures=failures)


# ---------------------------------------------------------------------------
# Factories: the objects compiled artifacts are loaded into


def build_decomposer(**kwargs: Any) -> ClaimDecomposer:
    return ClaimDecomposer(**kwargs)


def build_verifier(*, tries: int = 3, max_tokens: int = VERIFY_MAX_TOKENS, label_set: str = "four-way"
                   ) -> ClaimVerifier:
    return ClaimVerifier(tries=tries, max_tokens=max_tokens, label_set=label_set)


def build_checker(*, evidence_mode: str = "bm25", k: int = DEFAULT_K, budget_tokens: int | None = None,
                  concurrency: int = 4, decomposer: ClaimDecomposer | None = None,
                  verifier: ClaimVerifier | None = None) -> FaithfulnessChecker:
    return FaithfulnessChecker(decomposer or build_decomposer(), verifier or build_verifier(),
                               evidence_mode=evidence_mode, k=k, budget_tokens=budget_tokens,
                               concurrency=concurrency)
