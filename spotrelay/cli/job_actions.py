"""`spotrelay cancel / resume`: act on each job given, a line (or a JSON line) per job, one that fails not
stopping the others.

Siblings: spotrelay.cli.job_common (the options, the stack's client); spotrelay.cli.job_commands has the overview.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import typer

from spotrelay.cli.console import err, out
from spotrelay.cli.job_common import EndpointOption, RegionOption, StackOption, connect, json_line


def cancel_command(
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB_ID", help="what `spotrelay submit` printed")],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON line per job")] = False,
) -> None:
    """Cancel jobs wherever they are: their instances are terminated, their checkpoints are kept. A line
    per job; one that cannot be cancelled (an error line says why) does not stop the others: exit 2 if a
    job id is wrong, else 1 if AWS failed or refused for one, 0 once each is cancelled or had ended."""
    client = connect(stack, region, endpoint_url)
    code = for_each_job(job_ids, client.cancel, "cancelled", cancelled_line, as_json=as_json)
    if code:
        raise typer.Exit(code)


def resume_command(
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB_ID", help="a FAILED or CANCELLED job")],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON line per job")] = False,
) -> None:
    """Start FAILED or CANCELLED jobs again under the same ids, each from its newest committed checkpoint:
    a new run of the job, admitted like a new submission (quota, budget, priority), its earlier attempts
    and cost kept (`limits.max_total_cost` counts them; `max_interruptions` and `max_restarts` count the
    new run's). A line per job; exit 2 if a job id is wrong, else 1 if one could not be resumed (the line
    says why: it SUCCEEDED, is still running, or has spent its max_total_cost), 0 once each is queued."""
    client = connect(stack, region, endpoint_url)
    code = for_each_job(job_ids, client.resume, "resumed", resumed_line, as_json=as_json)
    if code:
        raise typer.Exit(code)


def for_each_job(
    job_ids: Sequence[str],
    act: Callable[[str], Mapping[str, Any]],
    done: str,
    line: Callable[[str, Mapping[str, Any]], str],
    *,
    as_json: bool,
) -> int:
    """`act` on each job once, in the order given, a line per job (a JSON line with --json); one that fails
    does not stop the others. An answer with `refused` (resume's) is an error line with the reason. The exit
    status: 2 if a job id is wrong (or no such job), else 1 if AWS failed or refused for one, else 0."""
    from spotrelay.aws.deployed_stack import USAGE, StackError

    code = 0
    for job_id in dict.fromkeys(job_ids):
        try:
            answer = act(job_id)
        except StackError as e:
            code = max(code, e.code)  # a wrong id (USAGE, 2) says more than a failure retrying may mend (1)
            if as_json:
                json_line({"job_id": job_id, "error": str(e)})
            else:
                err.print(f"error: {job_id} not {done}: {e}", markup=False, soft_wrap=True)
            continue
        refused = answer.get("refused")
        if refused:
            code = max(code, USAGE if answer.get("state") is None else 1)
        if as_json:
            json_line(answer)
        elif refused:
            err.print(f"error: {job_id} not {done}: {refused}", markup=False, soft_wrap=True)
        else:
            out.print(line(job_id, answer), markup=False, soft_wrap=True)
    return code


def resumed_line(job_id: str, answer: Mapping[str, Any]) -> str:
    """What the resume function did to the job, in words."""
    checkpoint = answer.get("checkpoint")
    start = (
        f"from checkpoint {checkpoint} ({float(answer.get('work_done_hours') or 0):.2f} h of work done)"
        if checkpoint
        else "from the start (it has no checkpoint)"
    )
    cost = f"${float(answer.get('cost_usd') or 0):.2f} spent so far"
    if answer.get("already"):
        return f"{job_id} was resumed already: run {answer.get('run')}, {answer.get('state')}; {cost}"
    notes = "".join(f"\n  note: {note}" for note in answer.get("notes") or [])
    return f"{job_id} QUEUED again as run {answer.get('run')}: it starts {start}; {cost}{notes}"


def cancelled_line(job_id: str, answer: Mapping[str, Any]) -> str:
    """What the cancel function did to the job, in words."""
    if answer.get("already_ended"):
        return f"{job_id} had already ended: {answer.get('state')}"
    if answer.get("before_admission"):
        return (
            f"{job_id} has no record yet: if its message is still in the queue, the dispatcher records it "
            "CANCELLED when it reads it (check the id if `spotrelay status` never shows it)"
        )
    terminated = answer.get("terminated") or []
    gone = f"; terminated {', '.join(terminated)}" if terminated else ""
    return f"{job_id} {answer.get('state')}{gone}"
