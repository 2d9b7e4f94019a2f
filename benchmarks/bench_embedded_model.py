"""Throughput of the embedded model (SmolLM2-135M-Instruct Q4_1 in llama.cpp) on this machine.

Prints prompt tokens/s, generated tokens/s, the cost of repeating a prompt (llama.cpp
reuses the cached prefix), and how the model's tokenizer counts compare with cl100k_base,
the tokenizer booklens budgets with.

    python benchmarks/bench_embedded_model.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from booklens.lm import LocalBackend
from booklens.text import count_tokens

STORY = Path(__file__).resolve().parents[1] / "examples" / "sample_story.txt"


def main() -> None:
    backend = LocalBackend()
    llm = backend._model()
    text = STORY.read_text(encoding="utf-8")
    prompt = text[:6000]
    n_prompt = len(llm.tokenize(prompt.encode()))
    print(f"model: {Path(backend.model_path).name}, threads: {backend.n_threads}, cores: {os.cpu_count()}")

    llm.reset()
    t0 = time.perf_counter()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    prompt_seconds = time.perf_counter() - t0
    print(f"prompt: {n_prompt} tokens in {prompt_seconds:.2f} s = {n_prompt / prompt_seconds:.0f} tokens/s")

    t0 = time.perf_counter()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    print(f"same prompt again (cached prefix): {time.perf_counter() - t0:.3f} s")

    short = "Write a long story about a lighthouse keeper who lost his light in a storm.\n\n"
    llm.reset()
    llm.create_completion(short, max_tokens=1, temperature=0.0)
    t0 = time.perf_counter()
    out = llm.create_completion(short, max_tokens=256, temperature=0.0)
    gen_seconds = time.perf_counter() - t0
    n_gen = out["usage"]["completion_tokens"]
    print(f"generation: {n_gen} tokens in {gen_seconds:.2f} s = {n_gen / gen_seconds:.0f} tokens/s")

    smol = len(llm.tokenize(text.encode(), add_bos=False))
    cl100k = count_tokens(text)
    print(f"tokenizer: sample story = {smol} SmolLM2 tokens vs {cl100k} cl100k_base tokens "
          f"(ratio {smol / cl100k:.2f})")


if __name__ == "__main__":
    main()
