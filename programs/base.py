"""The base classes of every booklens program: `dspy.Module` and `dspy.Predict` without DSPy's
stack walk on each call.

`dspy.Module.__getattribute__` calls `inspect.stack()` whenever `forward` is looked up, which
`Module.__call__` does on every call, only to warn when `forward` is called directly. That builds a
record of every frame on the stack, reading source lines and looking up each frame's module. With
a scripted LM that answers at once, a program call costs 3.9 ms on DSPy's classes and 2.1 ms on
these, from a shallow stack; from 60 frames down (a notebook, a web server, a test runner) 7.5 ms
against 2.0 ms (`benchmarks/bench_call_overhead.py`). These classes make the same check by looking
at the one frame that asked for `forward`.

State, saving, loading, copying and compiling are those of the DSPy classes: an artifact saved from
a `dspy.Predict` loads into a `Predict`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import dspy

logger = logging.getLogger(__name__)


def _lookup(self: Any, name: str) -> Any:
    attr = object.__getattribute__(self, name)
    if name != "forward" or not callable(attr):
        return attr
    caller = sys._getframe(0).f_back  # None when C code with no Python caller asked
    if caller is None or caller.f_code.co_name != "__call__":
        logger.warning("%s.forward(...) was called directly: call the module itself, so DSPy's callbacks "
                       "and usage tracking run.", type(self).__name__)
    return attr


class Module(dspy.Module):
    """`dspy.Module` for booklens programs (see the module docstring)."""

    __getattribute__ = _lookup


class Predict(dspy.Predict):
    """`dspy.Predict` for booklens programs (see the module docstring)."""

    __getattribute__ = _lookup


def prompt_tokens(predictor: dspy.Predict, **inputs: Any) -> int:
    """Tokens (cl100k_base) of the prompt `predictor` sends for `inputs`: with empty inputs, what its
    instructions, field layout and demos take. Programs size their inputs to the window with it."""
    from booklens.lm import BooklensAdapter
    from booklens.programs.coherence import SharedSummaryPredict, shared_summary_adapter
    from booklens.text import count_tokens

    adapter = dspy.settings.adapter or BooklensAdapter()
    if isinstance(predictor, SharedSummaryPredict):  # its demos show each summary once, as its calls do
        adapter = shared_summary_adapter(adapter)
    messages = adapter.format(predictor.signature, predictor.demos, inputs)
    return sum(count_tokens(str(m.get("content", ""))) + 4 for m in messages)
