"""`spotrelay` commands. Each command parses its input, calls the core, prints; errors are one line.

This module is the wiring: the typer app, and every command and group registered on it in the order
`spotrelay --help` lists them. The commands live by concern: the job commands in spotrelay.cli.job_commands
(and its job_* modules), `admin` in spotrelay.cli.admin, `place` in spotrelay.cli.place, `prices` in
spotrelay.cli.prices, `agent` in spotrelay.cli.agent_cli, `local` in spotrelay.cli.local_commands, and
`bench`, `replay` and `events` in spotrelay.cli.replay_commands.
"""

from __future__ import annotations

import typer

from spotrelay.cli import admin, job_commands
from spotrelay.cli.agent_cli import agent_command
from spotrelay.cli.local_commands import local_app
from spotrelay.cli.place import place_command
from spotrelay.cli.prices import prices_command
from spotrelay.cli.replay_commands import bench_command, events_app, replay_command

app = typer.Typer(
    name="spotrelay",
    help="Run GPU jobs on EC2 Spot: the cheapest pool that fits, checkpoints to S3, relaunch after interruptions.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def root() -> None:
    """Run GPU jobs on EC2 Spot: the cheapest pool that fits, checkpoints to S3, relaunch after interruptions."""


# A user's jobs on a deployed stack first: what most people run.
app.command("submit")(job_commands.submit_command)
app.command("status")(job_commands.status_command)
app.command("ls")(job_commands.ls_command)
app.command("logs")(job_commands.logs_command)
app.command("cost")(job_commands.cost_command)
app.command("wait")(job_commands.wait_command)
app.command("cancel")(job_commands.cancel_command)
app.command("resume")(job_commands.resume_command)
app.add_typer(admin.admin_app, name="admin")
app.command("place")(place_command)
app.command("prices")(prices_command)
app.command("agent")(agent_command)
app.add_typer(local_app, name="local")
app.command("bench")(bench_command)
app.command("replay")(replay_command)
app.add_typer(events_app, name="events")


def main() -> None:
    app()
