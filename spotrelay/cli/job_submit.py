"""`spotrelay submit`: check a job file (or a spec piped to stdin), send it to the stack's job queue and print
the job's id; with --wait, then wait for the job as `spotrelay wait` does (spotrelay.cli.job_wait).

Siblings: spotrelay.cli.job_common (the options, the stack's client); spotrelay.cli.job_commands has the overview.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from spotrelay.cli.console import err, fail, out
from spotrelay.cli.job_common import (
    EndpointOption,
    JsonOption,
    RegionOption,
    StackOption,
    connect,
    json_line,
    on_client,
)
from spotrelay.cli.job_wait import WAIT_POLL_SECONDS, PollOption, TimeoutOption, wait_and_report, wait_timeout
from spotrelay.models import JobSpecError, load_job_spec, parse_job_spec
from spotrelay.models.job_spec import JOB_SPEC_LIMITS, decode_document, document_text


def read_stdin() -> str:
    """A job spec piped in, read no further than a job file would be (`load_job_spec`), and refused if it
    is not UTF-8 text."""
    limit = JOB_SPEC_LIMITS.max_bytes + 1
    stream = getattr(sys.stdin, "buffer", None)  # bytes, so a binary stream is refused, not mis-decoded
    data = stream.read(limit) if stream is not None else sys.stdin.read(limit).encode()
    return document_text(data, "stdin")


def submit_command(
    job_file: Annotated[
        Path, typer.Argument(metavar="JOB.yaml", help="a job spec, YAML or JSON (README); - reads it from stdin")
    ],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    wake: Annotated[
        bool, typer.Option("--wake/--no-wake", help="invoke the dispatcher now, rather than wait for its alarm")
    ] = True,
    wait: Annotated[
        bool, typer.Option("--wait", help="then wait until the job ends, as `spotrelay wait` does (its exit status)")
    ] = False,
    timeout_text: TimeoutOption = None,
    poll_seconds: PollOption = WAIT_POLL_SECONDS,
    as_json: JsonOption = False,
) -> None:
    """Check JOB.yaml, send it to the stack's job queue and print the job's id.

    \b
    The same as `aws sqs send-message --message-body "$(cat job.json)"`,
    except that a bad spec is refused here, with the field and what is
    allowed, rather than recorded FAILED by the dispatcher; and the
    dispatcher is woken at once (the queue-depth alarm would within minutes).
    With --wait, it then waits for the job to end: exit 0 if it SUCCEEDED.
    """

    if timeout_text is not None and not wait:
        fail("--timeout: a limit on --wait; give --wait too")
    timeout = wait_timeout(timeout_text)  # a bad --timeout sends nothing
    try:
        if str(job_file) == "-":  # `... | spotrelay submit -`
            spec = parse_job_spec(decode_document(read_stdin(), "stdin"), "stdin")
        else:
            spec = load_job_spec(job_file)
    except JobSpecError as e:
        fail(str(e))
    client = connect(stack, region, endpoint_url)
    submitted = on_client(client, lambda c: c.submit(spec, wake=wake))
    if as_json:
        answer = {
            "job_id": submitted.job_id,
            "message_id": submitted.message_id,
            "queue_url": submitted.queue_url,
            "dispatcher_woken": submitted.dispatcher_woken,
            "wake_error": submitted.wake_error,
        }
        json_line(answer)
    else:
        out.print(submitted.job_id, markup=False)
    if submitted.wake_error is not None:
        err.print(
            f"warning: could not wake the dispatcher ({submitted.wake_error}); the queue-depth alarm or the "
            "5-minute schedule admits the job",
            markup=False,
        )
    if wait:
        # The job has no record until the dispatcher reads its message: this one is known to be sent
        waited = wait_and_report(
            client,
            [submitted.job_id],
            timeout=timeout,
            poll_seconds=poll_seconds,
            as_json=as_json,
            unrecorded=frozenset({submitted.job_id}),
        )
        raise typer.Exit(waited)
