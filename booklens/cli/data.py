"""`booklens data ...`: commands about datasets. Dataset modules add their commands to
`stats_app` (`booklens data stats NAME`)."""

from __future__ import annotations

from booklens.cli import app
from booklens.cli.common import command_group

data_app = command_group(help="Datasets: statistics of the annotation releases.", no_args_is_help=True)
stats_app = command_group(help="Statistics of a dataset (the tables of its paper).", no_args_is_help=True)
data_app.add_typer(stats_app, name="stats")
app.add_typer(data_app, name="data")
