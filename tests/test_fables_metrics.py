"""FABLES metrics: per-label F1 as in Table 5, accuracy, confusion matrix by summarizer, and
decomposition precision / recall by semantic matching."""

from __future__ import annotations

import dspy
import numpy as np
import pytest

from booklens.metrics.fables import (
    MATCH_THRESHOLD,
    decomposition_metric,
    decomposition_report,
    decomposition_scores,
    format_f1_table,
    label_f1,
    verification_metric,
    verification_report,
    verification_scores,
)


def test_label_f1_by_hand():
    gold = ["faithful", "faithful", "faithful", "unfaithful", "unfaithful"]
    pred = ["faithful", "unfaithful", None, "unfaithful", "faithful"]
    f = label_f1(gold, pred, "faithful")
    # tp=1, predicted faithful=2, gold faithful=3
    assert f["precision"] == pytest.approx(1 / 2) and f["recall"] == pytest.approx(1 / 3)
    assert f["f1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))
    u = label_f1(gold, pred, "unfaithful")
    assert u["precision"] == pytest.approx(1 / 2) and u["recall"] == pytest.approx(1 / 2) and u["f1"] == pytest.approx(0.5)
    assert label_f1(["faithful"], ["unfaithful"], "faithful")["f1"] == 0.0
    assert label_f1(["faithful"], ["faithful"], "unfaithful")["f1"] is None  # nothing to score


def test_partial_and_unverifiable_gold_claims_are_left_out_but_predictions_count():
    gold = ["faithful", "partial support", "can't verify", "unfaithful", "faithful"]
    pred = ["faithful", "faithful", "faithful", "partial support", "can't verify"]
    s = verification_scores(gold, pred)
    assert s["n"] == 3  # the gold partial / can't verify claims are not scored
    assert s["f1"]["faithful"]["precision"] == 1.0 and s["f1"]["faithful"]["recall"] == 0.5
    assert s["f1"]["unfaithful"]["f1"] == 0.0  # predicted "partial support" for the unfaithful claim
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["confusion"]["unfaithful"]["partial support"] == 1
    assert s["confusion"]["faithful"] == {"faithful": 1, "unfaithful": 0, "partial support": 0,
                                          "can't verify": 1, "failed": 0}
    all_labels = verification_scores(gold, pred, labels=("faithful", "unfaithful", "partial support", "can't verify"))
    assert all_labels["n"] == 5


def test_failures_count_against_recall_and_are_reported():
    s = verification_scores(["faithful", "unfaithful"], [None, "unfaithful"])
    assert s["failures"] == 1 and s["confusion"]["faithful"]["failed"] == 1
    assert s["f1"]["faithful"]["f1"] == 0.0 and s["f1"]["unfaithful"]["f1"] == 1.0


def test_report_by_summarizer():
    gold = ["faithful", "unfaithful", "faithful", "faithful"]
    pred = ["faithful", "faithful", "faithful", "unfaithful"]
    groups = ["GPT-4", "GPT-4", "MIXTRAL", "MIXTRAL"]
    r = verification_report(gold, pred, groups)
    assert set(r["by_summarizer"]) == {"GPT-4", "MIXTRAL"}
    assert r["by_summarizer"]["GPT-4"]["accuracy"] == 0.5 and r["by_summarizer"]["MIXTRAL"]["n"] == 2
    assert r["overall"]["n"] == 4 and r["overall"]["accuracy"] == 0.5
    table = format_f1_table(r, reference={"Overall": (0.675, 0.259)})
    assert "Overall" in table and "0.675" in table and "MIXTRAL" in table


def test_verification_metric():
    ex = dspy.Example(claim="c", evidence=[], label="unfaithful").with_inputs("claim", "evidence")
    assert verification_metric(ex, dspy.Prediction(label="unfaithful")) == 1.0
    assert verification_metric(ex, dspy.Prediction(label="faithful")) == 0.0
    assert verification_metric(ex, dspy.Prediction(label=None)) == 0.0


# ---------------------------------------------------------------------------
# Decomposition


def one_hot_embed(vocabulary):
    """Texts with the same key word get the same vector; others are orthogonal."""
    def embed(texts):
        out = np.zeros((len(texts), len(vocabulary) + 1), dtype="float32")
        for i, t in enumerate(texts):
            hits = [j for j, w in enumerate(vocabulary) if w in t.lower()]
            out[i, hits[0] if hits else len(vocabulary)] = 1.0
        return out
    return embed


def test_decomposition_precision_and_recall_with_a_controlled_embedder():
    embed = one_hot_embed(["lighthouse", "storm", "letter", "wedding"])
    gold = ["The lighthouse goes dark.", "A storm hits the coast.", "Mara writes a letter."]
    pred = ["The lighthouse lamp fails.", "A storm arrives.", "A wedding takes place.", "The lighthouse is old."]
    s = decomposition_scores(pred, gold, embed_fn=embed)
    assert s["supported"] == 3 and s["precision"] == pytest.approx(3 / 4)  # the wedding is not in the reference
    assert s["recalled"] == 2 and s["recall"] == pytest.approx(2 / 3)  # the letter was missed
    assert decomposition_scores([], gold, embed_fn=embed)["recall"] == 0.0
    assert decomposition_scores(pred, [], embed_fn=embed)["recall"] is None
    report = decomposition_report([(pred, gold), (gold, gold)], embed_fn=embed)
    assert report["overall"]["predicted"] == 7 and report["overall"]["supported"] == 6
    assert report["overall"]["recall"] == pytest.approx(5 / 6)


def test_semantic_matching_with_the_real_model():
    """Paraphrases match at the documented threshold; different facts about the same people do not."""
    gold = ["Iris Winnow works at the Oath Gazette newspaper in the city of Oath.",
            "Roman Kitt breaks off his engagement to Elinor Little.",
            "Forest was healed by Dacre after being wounded."]
    pred = ["In the city of Oath, Iris Winnow has a job at the newspaper called the Oath Gazette.",
            "Roman Kitt ends his engagement with Elinor Little.",
            "Iris Winnow adopts a stray cat named Biscuit."]
    # a different fact about the same person stays below the threshold
    near_miss = decomposition_scores(["Roman Kitt is under pressure from his father to join the family business."],
                                     ["Roman Kitt breaks off his engagement to Elinor Little."])
    assert near_miss["supported"] == 0
    s = decomposition_scores(pred, gold)
    assert s["supported"] == 2 and s["recalled"] == 2, s
    assert MATCH_THRESHOLD == 0.8
    ex = dspy.Example(summary="...", claims=gold).with_inputs("summary")
    assert decomposition_metric(ex, dspy.Prediction(claims=pred)) == pytest.approx(2 / 3)
