"""Corpus sweeps: every system of a manifest on every book, judged the same way, compared.

- `manifest`: the YAML manifest (pydantic), checked and resolved (`load_manifest`).
- `engines`: `local` (threads sharing one LM pool) and `ray` (Ray Data workers), both running
  each cell with the library pipeline (`booklens.pipeline.run_book`).
- `aggregate`: `cells.jsonl` and `results.json` (bootstrap intervals over books, paired differences).
- `report`: the sweep's self-contained `report.html`.
- `tables`: the comparison as markdown, LaTeX or CSV text (`booklens report DIR --table`).
- `estimate`: `--dry-run`'s calls, tokens and cost from the summarizer's own planning code.
- `run`: `run_sweep(manifest, output, ...)` and `dry_run(...)`, what `booklens sweep` calls.
"""

# Where a sweep's cells run (the `engines` module has one class each). Kept here, light to
# import, so the command's choices come from it too.
ENGINES = ("local", "ray")

# A sweep directory's plan (manifest, books, systems, judge): what marks a directory as a sweep's.
PLAN_FILE = "sweep.json"

# The texts `booklens report SWEEP_DIR --table` prints (`tables.render_table`), kept here for the
# command's choices as ENGINES is.
TABLE_FORMATS = ("markdown", "latex", "csv", "csv-pairs")
