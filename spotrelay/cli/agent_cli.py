"""`spotrelay agent`: the command systemd starts on each GPU worker to run its job attempt (the agent itself:
spotrelay.agent.main, imported when it runs).

Registered by spotrelay.cli.app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotrelay.agent import JOB_USER
from spotrelay.cli.console import fail
from spotrelay.config import ENV_AGENT_LOG_GROUP, ENV_BUCKET, ENV_TABLE, ENV_VEND_FUNCTION


def agent_command(
    job_id: Annotated[
        str | None, typer.Option("--job-id", help="default: the instance tag spotrelay:job-id, from IMDS")
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="default: the instance tag spotrelay:attempt, from IMDS")
    ] = None,
    bucket: Annotated[str | None, typer.Option("--bucket", envvar=ENV_BUCKET, help="the checkpoint bucket")] = None,
    table: Annotated[str | None, typer.Option("--table", envvar=ENV_TABLE, help="the job table")] = None,
    log_group: Annotated[
        str | None,
        typer.Option(
            "--log-group", envvar=ENV_AGENT_LOG_GROUP, help="CloudWatch Logs group for the log lines too (the stack's)"
        ),
    ] = None,
    vend_function: Annotated[
        str | None,
        typer.Option(
            "--vend-function",
            envvar=ENV_VEND_FUNCTION,
            help="the stack's vend function: the job's credentials (else the agent's own are used)",
        ),
    ] = None,
    job_user: Annotated[
        str | None,
        typer.Option(
            "--job-user", help=f"when the agent runs as root, the job runs as this user (the unit's: {JOB_USER})"
        ),
    ] = None,
    imds_endpoint: Annotated[
        str, typer.Option("--imds-endpoint", help="instance metadata service (IMDSv2); a local stub in tests")
    ] = "http://169.254.169.254",
    poll_seconds: Annotated[
        float, typer.Option("--poll-seconds", min=0.01, help="how often IMDS is polled for notices")
    ] = 5.0,
    heartbeat_seconds: Annotated[
        float, typer.Option("--heartbeat-seconds", min=0.01, help="how often the task token is heartbeaten")
    ] = 60.0,
    region: Annotated[
        str | None, typer.Option("--region", help="default: AWS_REGION, AWS_DEFAULT_REGION, else IMDS")
    ] = None,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="where the agent keeps the state that survives its restart")
    ] = Path("/var/lib/spotrelay"),
    checkpoint_dir: Annotated[
        Path | None, typer.Option("--checkpoint-dir", help="instead of the job's checkpoint.dir (local runs)")
    ] = None,
    previous_checkpoint_wait: Annotated[
        float,
        typer.Option(
            "--previous-checkpoint-wait",
            min=0,
            help="seconds after the previous attempt's notice to wait for its final checkpoint",
        ),
    ] = 150.0,
    migrate_poll_seconds: Annotated[
        float,
        typer.Option(
            "--migrate-poll-seconds", min=0.01, help="how often the attempt record is read for a migration request"
        ),
    ] = 60.0,
    standby_wait_seconds: Annotated[
        float,
        typer.Option("--standby-wait-seconds", min=0, help="how long a standby attempt waits to be handed its job"),
    ] = 1800.0,
) -> None:
    """Run this instance's job attempt: restore, run, checkpoint, report.

    \b
    Started by systemd on each GPU worker (see spotrelay.agent.systemd_unit):
    1. Learns the job id and attempt from the instance's tags (IMDSv2),
       unless --job-id/--attempt are given, and the task token from the
       attempt record in DynamoDB (never from user data).
    2. Restores the job's latest complete checkpoint from S3 into
       checkpoint.dir, verifying every file's size and sha256; a corrupt
       checkpoint fails the task with CheckpointCorrupt, the job does not
       start. If the previous attempt was interrupted and its final
       checkpoint is not committed yet, waits for it first.
    3. Runs the job (run.image with docker and GPUs, or run.command with
       /bin/sh) with SPOTRELAY_JOB_ID, SPOTRELAY_ATTEMPT,
       SPOTRELAY_CHECKPOINT_DIR, SPOTRELAY_RESUMED=1|0 and
       SPOTRELAY_PROGRESS_FILE in its environment.
    4. Polls IMDS every --poll-seconds. On a spot interruption notice:
       SIGTERM to the job, up to checkpoint.grace_seconds for it to save,
       upload the checkpoint dir (data, then the manifest, then the pointer
       by a conditional write), fail the task with SpotInterrupted. On a
       rebalance recommendation: checkpoint early. Every
       checkpoint.interval_minutes: upload what changed (incremental).
    5. Heartbeats the task token; reports success (exit 0), or JobFailed
       with the exit code and the last lines of the job's output.
    6. Reads its attempt record every --migrate-poll-seconds: when the
       control plane asks for a handover (a spot standby runs, ready to
       take the job off on-demand), stops and checkpoints as at a notice
       and fails the task with Migrating. An agent on a standby waits up
       to --standby-wait-seconds to be handed the job.

    \b
    Logs are JSON lines on stdout, each with job_id and attempt, and
    with --log-group in CloudWatch Logs too (`spotrelay logs` reads them). A
    restarted agent re-attaches to the running job (state in --state-dir)
    and never runs it twice; one whose outcome is reported does nothing.
    Exit status 0 once the outcome is reported (or when asked to stop,
    leaving the job running), non-zero when it cannot go on.
    """
    from spotrelay.agent.main import AgentOptions, run_agent

    if bucket is None or table is None:
        fail("give --bucket and --table (or SPOTRELAY_BUCKET and SPOTRELAY_TABLE)")
    if (job_id is None) != (attempt is None):
        fail("give --job-id and --attempt together, or neither (then the instance tags name them)")
    code = run_agent(
        AgentOptions(
            job_id=job_id,
            attempt=attempt,
            bucket=bucket,
            table=table,
            imds_endpoint=imds_endpoint,
            region=region,
            poll_seconds=poll_seconds,
            heartbeat_seconds=heartbeat_seconds,
            state_dir=state_dir,
            checkpoint_dir=checkpoint_dir,
            previous_checkpoint_wait_seconds=previous_checkpoint_wait,
            migrate_poll_seconds=migrate_poll_seconds,
            standby_wait_seconds=standby_wait_seconds,
            log_group=log_group,
            vend_function=vend_function,
            job_user=job_user,
        )
    )
    raise typer.Exit(code)
