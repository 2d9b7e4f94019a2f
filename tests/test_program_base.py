"""booklens programs are built on `booklens.programs.base`: DSPy's Module and Predict without the
`inspect.stack()` walk DSPy makes on every call (see that module)."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil

import dspy
import pytest

import booklens.programs
from booklens.lm import BooklensAdapter
from booklens.programs.base import Module, Predict
from booklens.testing import ScriptedLM


def program_modules():
    return [importlib.import_module(f"booklens.programs.{m.name}")
            for m in pkgutil.iter_modules(booklens.programs.__path__) if m.name != "base"]


def test_every_program_class_and_predictor_is_built_on_the_base_classes():
    classes = [cls for module in program_modules() for cls in vars(module).values()
               if inspect.isclass(cls) and issubclass(cls, dspy.Module) and cls.__module__ == module.__name__]
    assert len(classes) >= 17
    plain = [cls.__qualname__ for cls in classes if not issubclass(cls, (Module, Predict))]
    assert plain == [], f"built on dspy.Module or dspy.Predict directly: {plain}"

    from booklens.programs.faithfulness import build_checker
    from booklens.programs.summarizer import make_summarizer

    programs = [make_summarizer("hier"), make_summarizer("inc"), build_checker()]
    for cls in classes:  # and every program that needs no arguments
        try:
            programs.append(cls())
        except TypeError:
            continue
    predictors = [(type(p).__name__, name, predictor) for p in programs for name, predictor in p.named_predictors()]
    assert len(programs) >= 15 and len(predictors) >= 35
    plain = [(owner, name) for owner, name, predictor in predictors if not isinstance(predictor, Predict)]
    assert plain == [], f"plain dspy.Predict: {plain}"


@pytest.fixture
def stack_walks(monkeypatch):
    """inspect.stack() calls made by this test's thread (a thread left over from another test is not counted)."""
    import threading

    walks = []
    real = inspect.stack
    mine = threading.get_ident()

    def counted(*args, **kwargs):
        if threading.get_ident() == mine:
            walks.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(inspect, "stack", counted)
    return walks


def decomposer_lm():
    return ScriptedLM(lambda call: {"claims": ["Mara keeps the light.", "Tobin brings oil."]})


def test_a_program_call_walks_no_stack(stack_walks):
    from booklens.programs.faithfulness import ClaimDecomposer

    with dspy.context(lm=decomposer_lm(), adapter=BooklensAdapter()):
        result = ClaimDecomposer()(summary="Mara keeps the light. Tobin brings oil.")
        assert result.claims == ["Mara keeps the light.", "Tobin brings oil."]
        assert stack_walks == []  # two module calls (the program and its predictor)
        # the same predictor as a plain dspy.Predict walks the stack on each call
        from booklens.signatures.faithfulness import DecomposeSummary

        dspy.Predict(DecomposeSummary)(summary="Mara keeps the light.")
        assert len(stack_walks) >= 1


def test_calling_forward_directly_still_warns_and_calling_the_module_does_not(caplog):
    from booklens.programs.faithfulness import ClaimDecomposer

    program = ClaimDecomposer()
    with dspy.context(lm=decomposer_lm(), adapter=BooklensAdapter()), caplog.at_level(logging.WARNING):
        program(summary="Mara keeps the light.")
        assert not [r for r in caplog.records if "forward" in r.getMessage()]
        program.forward(summary="Mara keeps the light.")
    warned = [r.getMessage() for r in caplog.records if "forward" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("ClaimDecomposer.forward(...) was called directly")


def test_an_artifact_saved_from_plain_dspy_predictors_loads_into_the_programs(tmp_path):
    """State is DSPy's: what a plain `dspy.Predict` saved loads into the booklens predictor."""
    from booklens.programs.faithfulness import ClaimDecomposer
    from booklens.signatures.faithfulness import DecomposeSummary

    class PlainDecomposer(dspy.Module):
        def __init__(self):
            super().__init__()
            self.decompose = dspy.Predict(DecomposeSummary)

    plain = PlainDecomposer()
    plain.decompose.demos = [dspy.Example(summary="Ada sails.", claims=["Ada sails."])]
    plain.save(str(tmp_path / "program.json"))
    loaded = ClaimDecomposer()
    loaded.load(str(tmp_path / "program.json"))
    assert isinstance(loaded.decompose, Predict)
    assert [d["claims"] for d in loaded.decompose.demos] == [["Ada sails."]]


def test_forward_looked_up_with_no_python_caller_warns_instead_of_failing(caplog):
    """C code in a thread of its own has no Python frame below the lookup (DSPy's check allows for it)."""
    import _thread
    import operator
    import time

    from booklens.programs.faithfulness import ClaimDecomposer

    def warned():
        return [r.getMessage().split(" was")[0] for r in caplog.records if r.name == "booklens.programs.base"]

    with caplog.at_level(logging.WARNING):
        _thread.start_new_thread(operator.attrgetter("forward"), (ClaimDecomposer(),))
        deadline = time.monotonic() + 30  # the thread's one lookup; waits only if it never warns
        while not warned() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert warned() == ["ClaimDecomposer.forward(...)"]
