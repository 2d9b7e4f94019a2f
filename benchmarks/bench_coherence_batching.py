"""LM calls and prompt tokens of BooookScore per summary: per-sentence mode vs batched mode.

Runs `CoherenceScorer` over the 100 human-annotated incremental summaries (GPT-4, chunk
size 4096) with a scripted LM that answers with the human labels, so every mode returns
the same annotations and only the cost differs. Per summary it reports LM calls, prompt
tokens (cl100k, system + user message), the prompt tokens left after prefix caching (the
part of each prompt that differs from the previous prompt of the same summary: what a
provider or llama.cpp that caches shared prefixes must still process), and completion
tokens. The per-sentence mode (the paper's) is the baseline measured in the same run.

A last row drops 10% of the batched answers on the first ask (a model that skips
sentences), to show what the checked re-asks cost.

The programs are the zero-shot ones (`--zero-shot` on the commands) unless `--judge default`
asks for booklens's default few-shot judge, whose demos (32 labelled sentences for per-sentence
judging, 2 summaries for batched judging) are part of every prompt.

Four of these summaries repeat a sentence word for word, two of them with different human labels
on the copies; the responder tells the copies apart as the model does: by the occurrence the
per-sentence prompt names, and by the number of a batched sentence.

    python benchmarks/bench_coherence_batching.py [--limit N] [--judge zero-shot|default]
                                                  [--data ../shared/data/booookscore]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from _cli import positive_int, run

JUDGES = ("zero-shot", "default")


def _norm(text: str) -> str:
    return " ".join(text.split())


OCCURRENCE = re.compile(r"\n\(This sentence occurs \d+ times in the summary; judge occurrence (\d+)\.\)$")


def make_responder(labels: dict[tuple[str, int], dict], sentences: dict[str, list[str]], drop: float = 0.0,
                   seed: int = 0):
    """Answer like the human annotators did; optionally skip a share of batched answers on the first ask.
    `labels` is keyed by (summary, sentence index), `sentences` lists each summary's sentences."""
    rng = random.Random(seed)

    def index_of(summary: str, sentence: str, occurrence: int) -> int:
        found = [i for i, s in enumerate(sentences.get(summary, [])) if _norm(s) == _norm(sentence)]
        return found[occurrence - 1] if len(found) >= occurrence else -1

    def verdict(summary: str, index: int) -> dict:
        ann = labels.get((_norm(summary), index))
        if ann and ann["confusing"]:
            return {"verdict": "confusion", "questions": ann["questions"] or ["What does this refer to?"],
                    "error_types": ann["types"]}
        return {"verdict": "no confusion", "questions": [], "error_types": []}

    def respond(call):
        if call.wants("answers"):
            answers = []
            for line in call.inputs["sentences"].splitlines():
                m = re.match(r"^(\d+): (.*)$", line)
                if not m:
                    continue
                if drop and call.attempt == 0 and rng.random() < drop:
                    continue
                answers.append({"number": int(m.group(1)), **verdict(call.inputs["summary"], int(m.group(1)) - 1)})
            return {"answers": answers}
        sentence = call.inputs["sentence"]
        occurrence = OCCURRENCE.search(sentence)
        if occurrence:
            sentence = sentence[:occurrence.start()]
        summary = _norm(call.inputs["summary"])
        return verdict(summary, index_of(summary, sentence, int(occurrence.group(1)) if occurrence else 1))

    return respond


def prompt_text(call) -> str:
    return "\n".join(m["content"] for m in call.messages)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def run_mode(results, batch_size: int, drop: float = 0.0, judge: str = "zero-shot") -> dict:
    import dspy

    from booklens.judges import load_judge
    from booklens.lm import BooklensAdapter
    from booklens.testing import ScriptedLM
    from booklens.text import count_tokens

    labels = {}
    sentences = {}
    for r in results.values():
        sentences[_norm(r.summary)] = [s.sentence for s in r.sentences]
        for i, s in enumerate(r.sentences):
            labels[(_norm(r.summary), i)] = {"confusing": s.confusing, "types": list(s.types),
                                             "questions": list(s.questions)}
    lm = ScriptedLM(make_responder(labels, sentences, drop=drop))
    scorer = load_judge("coherence", zero_shot=judge == "zero-shot", batch_size=batch_size, concurrency=4)
    totals = {"calls": 0, "prompt_tokens": 0, "uncached_prompt_tokens": 0, "completion_tokens": 0, "failed": 0,
              "agree": 0, "sentences": 0}
    started = time.perf_counter()
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        for r in results.values():
            first = len(lm.backend.calls)
            prediction = scorer(summary=r.summary, sentences=[s.sentence for s in r.sentences])
            calls = lm.backend.calls[first:]
            previous = ""
            for call in calls:
                text = prompt_text(call)
                tokens = count_tokens(text)
                shared = common_prefix(previous, text)
                totals["prompt_tokens"] += tokens
                totals["uncached_prompt_tokens"] += count_tokens(text[shared:]) if shared else tokens
                previous = text
            totals["calls"] += len(calls)
            totals["failed"] += prediction.n_failed
            totals["sentences"] += len(r.sentences)
            totals["agree"] += sum(1 for a, h in zip(prediction.annotations, r.sentences) if a.confusing == h.confusing)
    completion = lm.usage.snapshot()["completion_tokens"]  # scripted answers: characters / 4
    totals["completion_tokens"] = completion
    totals["seconds"] = time.perf_counter() - started
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="the BooookScore data folder (default: ../shared/data/booookscore)")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N summaries (sorted by book)")
    parser.add_argument("--judge", choices=JUDGES, default="zero-shot",
                        help="the zero-shot programs, or the default few-shot judge with its demos in every prompt")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    import booklens  # noqa: F401  (offline defaults first)
    from booklens.data.booookscore import default_data_dir, load_human_config

    results = load_human_config("gpt4-4096-inc", args.data or default_data_dir(), stats=False)
    books = sorted(results)[: args.limit] if args.limit else sorted(results)
    results = {b: results[b] for b in books}
    n = len(results)
    n_sentences = sum(len(r.sentences) for r in results.values())
    judge = "zero-shot programs" if args.judge == "zero-shot" else "the default few-shot judge"
    print(f"{n} human-annotated incremental summaries (GPT-4, 4096), {n_sentences} sentences "
          f"({n_sentences / n:.1f} per summary); {judge}; scripted LM answering with the human labels\n")
    rows = [("per-sentence (baseline)", 1, 0.0), ("batched k=5", 5, 0.0), ("batched k=10", 10, 0.0),
            ("batched k=10, 10% answers skipped", 10, 0.1)]
    figures = {}
    print("| mode | LM calls / summary | prompt tokens / summary | after prefix caching / summary "
          "| completion tokens / summary | failed | same labels | vs baseline (prompt tokens) |")
    print("|---|---|---|---|---|---|---|---|")
    baseline = None
    for name, k, drop in rows:
        t = run_mode(results, k, drop, args.judge)
        figures[name] = t
        if baseline is None:
            baseline = t
        ratio = t["prompt_tokens"] / baseline["prompt_tokens"]
        print(f"| {name} | {t['calls'] / n:.1f} | {t['prompt_tokens'] / n:,.0f} | "
              f"{t['uncached_prompt_tokens'] / n:,.0f} | {t['completion_tokens'] / n:,.0f} | {t['failed']} | "
              f"{100 * t['agree'] / t['sentences']:.1f}% | {ratio:.2f}x |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"summaries": n, "sentences": n_sentences, "judge": args.judge,
                                         "modes": figures}, indent=2))


if __name__ == "__main__":
    run(main)
