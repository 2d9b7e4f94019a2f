"""Several sequences in one llama.cpp context: does batching calls make the embedded model write faster?

llama.cpp's server runs parallel requests as sequences of one context and decodes their tokens in
shared batches: one batch carries the next token of every sequence that is writing, and the rest
of the batch is filled with prompt tokens of sequences still reading. That pays where writing a
token costs little more than reading the weights once, so that S tokens in one batch cost about as
much as one. This benchmark measures it for the embedded model with booklens's settings, every
figure at the same context length (the tokens a step adds are removed before the next step):

- writing: S sequences with an L-token prompt each, one token per sequence in a batch of its own
  (taking turns) against one batch holding the next token of all S;
- reading and writing together: a 512-token micro-batch of one sequence's prompt alone, against
  the same batch with S - 1 of its prompt tokens replaced by the next tokens of the other sequences;
- one sequence, n tokens in one batch (the verification step of speculative decoding) against n
  single-token steps.

The KV cache is split by sequence (llama.cpp's advice for sequences that share no prefix);
`--unified` measures the unified cache too.

    python benchmarks/bench_embedded_sequences.py [--sequences 4] [--context 4000] [--steps 16] [--unified]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from _cli import positive_int, run

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
NOVEL = REPO.parent / "shared" / "data" / "books" / "pride_and_prejudice.txt"


class Context:
    """One llama.cpp context of `sequences` sequences, `window` tokens each, with booklens's settings."""

    def __init__(self, llm, sequences: int, window: int, unified: bool):
        import llama_cpp
        from llama_cpp import _internals

        self._c = llama_cpp
        params = llama_cpp.llama_context_default_params()
        for field, _ in llama_cpp.llama_context_params._fields_:
            setattr(params, field, getattr(llm.context_params, field))
        params.n_ctx, params.n_seq_max, params.kv_unified = sequences * window, sequences, unified
        self.context = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
        self.memory = llama_cpp.llama_get_memory(self.context.ctx)
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self.length = [0] * sequences  # tokens each sequence holds

    def decode(self, items: list[tuple[int, int]]) -> float:
        """Evaluate (sequence, token) pairs, each at its sequence's next position, asking logits for
        every one; the seconds it took."""
        batch = self.batch
        batch.n_tokens = len(items)
        for i, (seq, token) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, self.length[seq], 1, True
            batch.seq_id[i][0] = seq
            self.length[seq] += 1
        started = time.perf_counter()
        failed = self._c.llama_decode(self.context.ctx, batch)
        if failed:
            raise RuntimeError(f"llama_decode returned {failed}")
        return time.perf_counter() - started

    def truncate(self, seq: int, length: int) -> None:
        self._c.llama_memory_seq_rm(self.memory, seq, length, -1)
        self.length[seq] = length

    def close(self) -> None:
        self._c.llama_batch_free(self.batch)
        self.context.close()


def measure(llm, tokens: list[int], *, sequences: int, context: int, steps: int, unified: bool) -> None:
    ctx = Context(llm, sequences, 8192, unified)
    prompt_seconds = 0.0
    for seq in range(sequences):  # a different stretch of the book for each sequence
        text = tokens[seq * context:(seq + 1) * context]
        for start in range(0, context, 512):
            prompt_seconds += ctx.decode([(seq, t) for t in text[start:start + 512]])
    print(f"KV cache {'unified' if unified else 'split by sequence'}: {sequences} prompts of {context} tokens read "
          f"in {prompt_seconds:.1f} s ({sequences * context / prompt_seconds:.0f} tokens/s)")
    new = tokens[sequences * context:]

    def back() -> None:
        for seq in range(sequences):
            ctx.truncate(seq, context)

    turns = batched = 0.0
    for step in range(steps):
        for seq in range(sequences):
            turns += ctx.decode([(seq, new[step])])
        back()
        batched += ctx.decode([(seq, new[step]) for seq in range(sequences)])
        back()
    per_token_alone = turns / (steps * sequences)
    per_token_batched = batched / (steps * sequences)
    print(f"  writing: {per_token_alone * 1000:.1f} ms a token taking turns, {per_token_batched * 1000:.1f} ms in "
          f"batches of {sequences} ({per_token_alone / per_token_batched:.2f}x as fast)")

    alone = mixed = 0.0
    reps = max(2, steps // 4)
    for rep in range(reps):
        chunk = new[rep * 512:(rep + 1) * 512]
        alone += ctx.decode([(0, t) for t in chunk])
        back()
        others = [(seq, new[rep]) for seq in range(1, sequences)]
        mixed += ctx.decode(others + [(0, t) for t in chunk[:512 - len(others)]])
        back()
    alone, mixed = alone / reps, mixed / reps
    share = (512 - (sequences - 1)) / 512
    extra = mixed - alone * share
    print(f"  a 512-token prompt micro-batch: {alone * 1000:.0f} ms alone, {mixed * 1000:.0f} ms with "
          f"{sequences - 1} other sequences' next tokens in it: {extra / (sequences - 1) * 1000:.1f} ms a written "
          f"token there, against {per_token_alone * 1000:.1f} ms in a batch of its own")

    single = sum(ctx.decode([(0, new[i])]) for i in range(8)) / 8
    back()
    row = []
    for n in (2, 4, 8):
        reps = max(2, steps // n)
        seconds = 0.0
        for _ in range(reps):
            seconds += ctx.decode([(0, t) for t in new[:n]])
            back()
        seconds /= reps
        row.append(f"{n}: {seconds * 1000:.0f} ms ({seconds / single:.1f} steps)")
    print(f"  one sequence, n tokens in one batch: 1: {single * 1000:.0f} ms; " + "; ".join(row))
    ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=positive_int, default=4,
                        help="sequences in the context (calls in flight), at least 2")
    parser.add_argument("--context", type=positive_int, default=4000, help="prompt tokens of each sequence")
    parser.add_argument("--steps", type=positive_int, default=16, help="written tokens per sequence measured")
    parser.add_argument("--unified", action="store_true", help="measure the unified KV cache as well")
    args = parser.parse_args()
    if args.sequences < 2:
        parser.error("--sequences: at least 2 (the benchmark batches several sequences' tokens together)")
    if args.sequences > 16:
        parser.error("--sequences: at most 16 (each sequence holds a KV cache of 8,192 tokens)")
    if args.context + 600 > 8192:
        parser.error("--context leaves no room in an 8192-token sequence")
    import booklens  # noqa: F401  - offline settings
    from booklens.lm import LocalBackend

    backend = LocalBackend()
    llm = backend._model()
    text = (NOVEL if NOVEL.exists() else STORY).read_text(encoding="utf-8")
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    if len(tokens) < args.sequences * args.context + max(args.steps, max(2, args.steps // 4) * 512):
        parser.error(f"the text holds {len(tokens)} tokens, too few for {args.sequences} x {args.context}")
    print(f"model: {Path(backend.model_path).name} as {backend.weights}, threads: {backend.n_threads}, cores: "
          f"{os.cpu_count()}, flash attention {backend.flash_attention}; load average {os.getloadavg()[0]:.2f}")
    for unified in ([False, True] if args.unified else [False]):
        measure(llm, tokens, sequences=args.sequences, context=args.context, steps=args.steps, unified=unified)


if __name__ == "__main__":
    run(main)
