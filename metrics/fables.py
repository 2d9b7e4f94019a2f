"""FABLES metrics: claim-verification agreement with the human labels and claim-decomposition
precision / recall against the FABLES claims.

Verification (the seed's Table 5). Only claims whose human label is in `labels`
(by default faithful and unfaithful; partial support and can't verify are left out,
as in the seed) are scored. For each of those labels L:
precision = #(predicted L and gold L) / #(predicted L), recall = #(predicted L and gold L) / #(gold L),
F1 = 2PR / (P + R). A prediction of any other label, or a failed verification
(no valid label after the re-asks), counts as "not L" for every L: it can only lower
recall. F1 is 0.0 when nothing is predicted correctly and None when the label has neither
gold claims nor predictions. Accuracy is the share of scored claims whose predicted label
equals the gold label. The confusion matrix is gold label x predicted label (the four
labels plus "failed"). Everything is also given per summarizer.

Decomposition. Predicted claims P and reference claims G of one summary are embedded
with all-MiniLM-L6-v2 (unit vectors, so the dot product is the cosine). A predicted claim
is *supported* when some reference claim has cosine >= `MATCH_THRESHOLD` with it, and a
reference claim is *recalled* when some predicted claim has cosine >= the threshold with it.
Precision = supported / |P|, recall = recalled / |G| (matching is many-to-many, so one
predicted claim that merges two reference claims can recall both, and splitting one reference
claim in two is not punished). Corpus figures are micro averages (totals over summaries).
The threshold 0.8 was set on FABLES itself (`benchmarks/bench_fables_decomposition_threshold.py`):
claims of one summary against the claims another summarizer wrote about the same book, read band
by band. Below about 0.8 the best match is usually a different fact about the same characters
(MiniLM similarity leans on shared names: "Rhett publicly reveals Summer's past with Rob" vs
"Rhett is Summer's childhood crush" scores 0.77); from 0.8 up it is mostly the same fact in
other words ("Aurora struggles with her father's lack of attention and affection" vs "...an
emotionally distant father whose ... neglect ...", 0.82). Against claims about other books no
claim reaches 0.8.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from booklens.vocabulary import BINARY_LABELS, CLAIM_LABELS

FAILED = "failed"
PREDICTED_LABELS: tuple[str, ...] = CLAIM_LABELS + (FAILED,)
TABLE5_LABELS = BINARY_LABELS
MATCH_THRESHOLD = 0.8

# The seed's Table 5, human-evidence setting (GPT-4-TURBO as the rater): (faithful F1, unfaithful F1).
SEED_TABLE5_HUMAN_EVIDENCE = {
    "GPT-3.5-TURBO": (0.686, 0.369),
    "MIXTRAL": (0.760, 0.361),
    "GPT-4": (0.657, 0.229),
    "GPT-4-TURBO": (0.680, 0.264),
    "CLAUDE-3-OPUS": (0.510, 0.022),
    "Overall": (0.675, 0.259),
}


def _norm(label: Optional[str]) -> str:
    return FAILED if label is None else label


def label_f1(gold: Sequence[str], pred: Sequence[Optional[str]], label: str) -> dict[str, Any]:
    """Precision, recall and F1 of one label (see the module docstring for the conventions)."""
    pred = [_norm(p) for p in pred]
    tp = sum(1 for g, p in zip(gold, pred) if g == label and p == label)
    n_pred = sum(1 for p in pred if p == label)
    n_gold = sum(1 for g in gold if g == label)
    precision = tp / n_pred if n_pred else None
    recall = tp / n_gold if n_gold else None
    if n_pred == 0 and n_gold == 0:
        f1 = None
    elif tp == 0:
        f1 = 0.0
    else:
        f1 = 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1, "support": n_gold, "predicted": n_pred}


def verification_scores(gold: Sequence[str], pred: Sequence[Optional[str]], *,
                        labels: Sequence[str] = TABLE5_LABELS) -> dict[str, Any]:
    """Per-label F1, accuracy and confusion matrix over the claims whose gold label is in `labels`."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    pairs = [(g, _norm(p)) for g, p in zip(gold, pred) if g in labels]
    g_kept = [g for g, _ in pairs]
    p_kept = [p for _, p in pairs]
    confusion = {g: {p: 0 for p in PREDICTED_LABELS} for g in labels}
    for g, p in pairs:
        confusion[g][p] += 1
    return {
        "n": len(pairs),
        "f1": {label: label_f1(g_kept, p_kept, label) for label in labels},
        "accuracy": (sum(1 for g, p in pairs if g == p) / len(pairs)) if pairs else None,
        "failures": sum(1 for _, p in pairs if p == FAILED),
        "confusion": confusion,
    }


def verification_report(gold: Sequence[str], pred: Sequence[Optional[str]], groups: Sequence[str], *,
                        labels: Sequence[str] = TABLE5_LABELS) -> dict[str, Any]:
    """`verification_scores` overall and for each group (the summarizer that wrote the claim)."""
    if not (len(gold) == len(pred) == len(groups)):
        raise ValueError("gold, pred and groups must have the same length")
    names = list(dict.fromkeys(groups))
    by_group = {}
    for name in names:
        idx = [i for i, g in enumerate(groups) if g == name]
        by_group[name] = verification_scores([gold[i] for i in idx], [pred[i] for i in idx], labels=labels)
    return {"overall": verification_scores(gold, pred, labels=labels), "by_summarizer": by_group}


def verification_metric(example, prediction, trace=None) -> float:
    """1.0 when the predicted label equals the human label (a DSPy metric)."""
    return float(getattr(prediction, "label", None) == example.label)


def format_f1_table(report: dict[str, Any], *, reference: dict[str, tuple[float, float]] | None = None,
                    reference_name: str = "seed") -> str:
    """Faithful / unfaithful F1, accuracy and n per summarizer, next to reference F1s when given."""
    def fmt(x: Optional[float]) -> str:
        return "  -  " if x is None else f"{x:.3f}"

    head = f"{'Summarizer':<16}{'n':>5}{'F1 faithful':>13}{'F1 unfaithful':>15}{'accuracy':>10}{'failed':>8}"
    if reference:
        ref_faithful, ref_unfaithful = f"{reference_name} F1 faithful", f"{reference_name} F1 unfaithful"
        width = max(len(ref_faithful), len(ref_unfaithful)) + 2  # columns never run into each other
        head += f"{ref_faithful:>{width}}{ref_unfaithful:>{width}}"
    lines = [head, "-" * len(head)]
    rows = list(report["by_summarizer"].items()) + [("Overall", report["overall"])]
    for name, s in rows:
        line = (f"{name:<16}{s['n']:>5}{fmt(s['f1']['faithful']['f1']):>13}{fmt(s['f1']['unfaithful']['f1']):>15}"
                f"{fmt(s['accuracy']):>10}{s['failures']:>8}")
        if reference:
            ref = reference.get(name)
            line += f"{fmt(ref[0] if ref else None):>{width}}{fmt(ref[1] if ref else None):>{width}}"
        lines.append(line)
    return "\n".join(lines)


def format_confusion(confusion: dict[str, dict[str, int]]) -> str:
    cols = PREDICTED_LABELS
    head = f"{'gold / predicted':<18}" + "".join(f"{c:>16}" for c in cols)
    lines = [head]
    for g, row in confusion.items():
        lines.append(f"{g:<18}" + "".join(f"{row[c]:>16}" for c in cols))
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Decomposition


EmbedFn = Callable[[list[str]], np.ndarray]


def _default_embed(texts: list[str]) -> np.ndarray:
    from booklens.retrieval import embed

    return embed(texts)


def claim_similarity(pred: Sequence[str], gold: Sequence[str], embed_fn: EmbedFn | None = None) -> np.ndarray:
    """Cosine similarity matrix, rows = predicted claims, columns = reference claims."""
    if not pred or not gold:
        return np.zeros((len(pred), len(gold)), dtype="float32")
    embed_fn = embed_fn or _default_embed
    vectors = np.asarray(embed_fn(list(pred) + list(gold)), dtype="float32")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms == 0, 1.0, norms)
    return vectors[: len(pred)] @ vectors[len(pred):].T


def decomposition_scores(pred: Sequence[str], gold: Sequence[str], *, threshold: float = MATCH_THRESHOLD,
                         embed_fn: EmbedFn | None = None) -> dict[str, Any]:
    """Precision / recall of predicted claims against reference claims of one summary."""
    sim = claim_similarity(pred, gold, embed_fn)
    supported = int((sim.max(axis=1) >= threshold).sum()) if sim.size else 0
    recalled = int((sim.max(axis=0) >= threshold).sum()) if sim.size else 0
    return _pr(supported, len(pred), recalled, len(gold))


def _pr(supported: int, n_pred: int, recalled: int, n_gold: int) -> dict[str, Any]:
    precision = supported / n_pred if n_pred else None
    recall = recalled / n_gold if n_gold else None
    f1 = (2 * precision * recall / (precision + recall)) if precision and recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "supported": supported, "predicted": n_pred,
            "recalled": recalled, "reference": n_gold}


def decomposition_report(pairs: Iterable[tuple[Sequence[str], Sequence[str]]], *,
                         threshold: float = MATCH_THRESHOLD, embed_fn: EmbedFn | None = None) -> dict[str, Any]:
    """Micro-averaged precision / recall over (predicted, reference) claim lists, plus per-item scores."""
    items = [decomposition_scores(p, g, threshold=threshold, embed_fn=embed_fn) for p, g in pairs]
    total = _pr(sum(i["supported"] for i in items), sum(i["predicted"] for i in items),
                sum(i["recalled"] for i in items), sum(i["reference"] for i in items))
    return {"overall": total, "items": items, "threshold": threshold}


def decomposition_metric(example, prediction, trace=None) -> float:
    """F1 of the predicted claims against the example's reference claims (a DSPy metric)."""
    return float(decomposition_scores(list(getattr(prediction, "claims", []) or []), list(example.claims))["f1"])
