"""Names booklens accepts, and the summarizer defaults that every layer shares.

There is one list of each here. The programs, the records, the runs and the commands all read
it. The module imports only the standard library, so the command line can build its choices
from these lists without loading pydantic, DSPy or a model; that keeps `booklens --help` and
argument errors instant. Other lists already live in light modules and stay there: evidence
modes in `booklens.retrieval`, data splits in `booklens.data.splits`, sweep engines in
`booklens.sweep`, and structured-output modes in `booklens.lm.remote`.
"""

from __future__ import annotations

from typing import Literal, get_args

# ---------------------------------------------------------------------------
# Summaries (booklens.programs.summarizer, its records and sweep manifests)

# How a summary is made: hierarchical merging or incremental updating.
SummaryMethod = Literal["hier", "inc"]
SUMMARY_METHODS: tuple[str, ...] = get_args(SummaryMethod)
# The summarizer's defaults: tokens per chunk, G_n (tokens of a summary, the published code's
# 900), and W (tokens the model reads at once, for a model that does not say).
DEFAULT_CHUNK_SIZE = 2048
DEFAULT_SUMMARY_TOKENS = 900
DEFAULT_CONTEXT_WINDOW = 8192
# The option that names the window a judge's prompts are planned for (`window_option` of the steps),
# which refusals and advice name.
JUDGE_WINDOW_OPTION = "--context-window"
# Words asked for per token of budget: the published BooookScore code uses 0.65.
DEFAULT_WORDS_PER_TOKEN = 0.65

# Scripts written without spaces between words. In Chinese and Japanese (Han, kana) each character
# counts as a word when texts are matched or counted word by word (a run of them is a whole clause);
# Thai, Lao, Myanmar and Khmer are unspaced too, but their characters are letters, not words.
CHARACTER_WORD_SCRIPTS = ("\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
                          "\U00020000-\U0003134f")
UNSPACED_SCRIPTS = CHARACTER_WORD_SCRIPTS + "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"

# What a hierarchical merge that is not the first of its level sees as context.
MergeContextName = Literal["same-level", "lower-level", "none"]
MERGE_CONTEXTS: tuple[str, ...] = get_args(MergeContextName)
DEFAULT_MERGE_CONTEXT = "same-level"
# How often a summary that is over its budget, or cut off at the cap, is written again. Also how
# far past its budget G a generation may run (cap: G x slack + allowance tokens). The model's
# backend may ask for its own values (`summary_settings`); the embedded model does.
DEFAULT_MAX_REGENERATIONS = 2
DEFAULT_GENERATION_SLACK = 1.5
DEFAULT_GENERATION_ALLOWANCE = 64
# The smallest summarizer settings any command, manifest or program takes: below them a chunk
# holds barely a sentence, a window not even the prompt, a summary a phrase. A budget is in
# cl100k_base tokens; the same floor holds for G_n and every given level budget G_l. The window
# is the least in which both methods run at the least chunk and budget (their prompts, the
# compression of an incremental update first, take about 400 tokens).
MIN_CHUNK_SIZE = 64
MIN_CONTEXT_WINDOW = 512
MIN_SUMMARY_TOKENS = 16
# The smallest window `qa` and `diverse` take (--context-window), the library calls too.
MIN_QA_CONTEXT_WINDOW = 256
# The range of words a prompt may ask for per token of budget.
MIN_WORDS_PER_TOKEN = 0.1
MAX_WORDS_PER_TOKEN = 2.0
# The retry counts a user sets, (least, most): asks per item before it counts as failed, and
# regenerations of a summary over its budget. Ten is plenty for a flaky model; above it a slip (a
# string of zeros) would pay for one failing call over and over.
RETRY_RANGES = {"--tries": (1, 10), "--max-regenerations": (0, 10)}
DEFAULT_TRIES = 3  # the coherence judge's asks per sentence (`score --tries`)


def retry_range(option: str) -> str:
    """'from 1 to 10': the range of a retry count, as its help and its errors say it."""
    low, high = RETRY_RANGES[option]
    return f"from {low} to {high}"


def check_retries(option: str, value: object) -> None:
    """The one rule for a retry count (`RETRY_RANGES`), for the commands' parsers, the programs and
    the run configs: a whole number within its range, else a one-line error naming the range."""
    from booklens.errors import BooklensError, setting_name

    low, high = RETRY_RANGES[option]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BooklensError(f"{setting_name(option)} must be {retry_range(option)} (got {value!r})")


def check_words_per_token(value: float) -> None:
    """The one rule for --words-per-token (the summarizers and the command's parser): a finite number
    within its range. `nan` fails every comparison, so it is named for what it is."""
    import math

    from booklens.errors import BooklensError, setting_name

    name = setting_name("--words-per-token")
    if not math.isfinite(value):
        raise BooklensError(f"{name} must be a finite number (got {value})")
    if not MIN_WORDS_PER_TOKEN <= value <= MAX_WORDS_PER_TOKEN:
        raise BooklensError(f"{name} must be between {MIN_WORDS_PER_TOKEN} and {MAX_WORDS_PER_TOKEN} (got {value})")

# ---------------------------------------------------------------------------
# Claim verification (FABLES)

# The four judgments of FABLES, in our words, and the two of its binary rater (Table 5).
ClaimLabel = Literal["faithful", "unfaithful", "partial support", "can't verify"]
CLAIM_LABELS: tuple[str, ...] = get_args(ClaimLabel)
# The same four as the dataset names them, in the same order (`signatures.faithfulness.FABLES_LABELS`
# pairs them up).
FablesLabel = Literal["Yes", "No", "PartialSupport", "Inapplicable"]
FABLES_LABEL_NAMES: tuple[str, ...] = get_args(FablesLabel)
CANT_VERIFY: str = CLAIM_LABELS[3]  # the verdict when the evidence does not settle the claim
BinaryLabel = Literal["faithful", "unfaithful"]
BINARY_LABELS: tuple[str, ...] = get_args(BinaryLabel)


def labels_of(label_set: str | None) -> tuple[str, ...]:
    """The labels a verifier of `label_set` ("four-way", "binary") gives, as figures of its claims name them."""
    return BINARY_LABELS if label_set == "binary" else CLAIM_LABELS


# Where the evidence a claim is checked against came from: given quotes, or a passage of the book
# found by one of `booklens.retrieval.BOOK_MODES`.
EvidenceSource = Literal["given", "bm25", "dense", "hybrid", "book"]

# ---------------------------------------------------------------------------
# NovelQA (booklens.data.novelqa, booklens.programs.qa)

# Multiple choice, or a generated answer graded by a judge.
QA_SETTINGS = ("mc", "gen")
# How the evidence a model quotes is scored: by the seed's LLM judge (correctness, relevance and
# sufficiency, 0-100 each), or by word overlap with the located gold quotes (no LM call).
EVIDENCE_RECALL_MODES = ("llm", "overlap")

# ---------------------------------------------------------------------------
# DiverseSumm (booklens.programs.diverse, booklens.diverse_runs)

# How a summary of an event is written. `auto` writes it directly when the articles fit the
# window, and from extracted sentences when they do not.
DIVERSE_METHODS = ("auto", "direct", "extract")
# How equivalent answers to a reference question are grouped.
ANSWER_CLUSTERINGS = ("llm", "exact")
# What a judge measures: coverage of the reference QA pairs, or faithfulness to each article.
CRITERIA = ("coverage", "faithfulness")
# Single-answer ratings and their scales (lowest, highest). `pairwise` compares two summaries.
RATING_SCALES = {"binary": (0, 1), "likert": (1, 10)}
JUDGE_PROTOCOLS = (*RATING_SCALES, "pairwise")
# The rating protocols that each `--faithfulness` choice of `booklens diverse` runs.
FAITHFULNESS_CHOICES = {**{scale: (scale,) for scale in RATING_SCALES}, "both": tuple(RATING_SCALES), "none": ()}
# The verbosity-bias study rates each version alone, or puts original and extended side by side.
VERBOSITY_PROTOCOLS = ("single", "pairwise")


# ---------------------------------------------------------------------------
# Counts in the lines commands print


def counted(n: float, noun: str, shown: str | None = None) -> str:
    """'1 claim', '3 claims', '2 summaries': `noun` is the singular, made plural with an s (a y after
    a consonant becomes ies); `shown` writes the number another way ('1.2M')."""
    number = str(n) if shown is None else shown
    if n == 1:
        return f"{number} {noun}"
    if noun.endswith("y") and noun[-2:-1] not in ("", *"aeiou"):
        return f"{number} {noun[:-1]}ies"
    return f"{number} {noun}s"


def singular(plural: str) -> str:
    """The noun `counted` makes `plural` from ('summaries' -> 'summary'), for names kept in the plural."""
    if plural.endswith("ies"):
        return plural[:-3] + "y"
    return plural[:-1] if plural.endswith("s") else plural
