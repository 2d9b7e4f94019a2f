"""Compile booklens programs against human annotations, save and load the results.

- `booklens.optimizers.tasks`: what each compilable task is (program, data splits, metric).
- `booklens.optimizers.compile`: `compile_program(task, trainset, devset, optimizer=..., budget=..., seed=...)`.
- `booklens.optimizers.artifacts`: `save_program` / `load_program` (DSPy's JSON state plus booklens metadata).
- `booklens.optimizers.evaluate`: run a program on a split, bootstrap confidence intervals (`booklens.metrics.bootstrap`), usage, tables.
- `booklens.optimizers.workflow`: `booklens compile` and `booklens evaluate` as library calls (`compile_task`, `evaluate_task`).
"""

from booklens.optimizers.compile import OPTIMIZERS, Budget, compile_program

__all__ = ["OPTIMIZERS", "Budget", "compile_program"]
