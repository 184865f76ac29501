"""`spotrelay submit / status / ls / logs / cost / wait / cancel`: a user's jobs on a deployed stack
(spotrelay.aws.deployed_stack).

The commands are plain functions; spotrelay.cli.app registers them. boto3 is imported when one runs.
Each concern is a module of its own, all of it re-exported here:

- spotrelay.cli.job_common: what the commands share: their options, the clock they count on (`command_clock`,
  `utc_now`), the stack's client (`connect`, `on_stack`, `on_client`), the spot prices in effect
  (`prices_in_effect`), `json_line` and `iso_time`
- spotrelay.cli.job_submit: `submit` (a job file, or stdin)
- spotrelay.cli.job_status: `status` and `status --watch`: the status in words (`describe_status`,
  `after_patience`) and the attempts table
- spotrelay.cli.job_list: `ls`, its filters and rows
- spotrelay.cli.job_logs: `logs` and `logs --follow`
- spotrelay.cli.job_cost_report: `cost`, and the estimate's note `ls` prints too
- spotrelay.cli.job_actions: `cancel` and `resume`, a line per job
- spotrelay.cli.job_wait: `wait`, and the polling `submit --wait` and `status --watch` share (`wait_for_jobs`)

A test that puts a fake clock, client or console in place patches it on the module that uses it.
"""

from __future__ import annotations

from spotrelay.cli.job_actions import cancel_command, cancelled_line, for_each_job, resume_command, resumed_line
from spotrelay.cli.job_common import (
    EndpointOption,
    JobIdArgument,
    JsonOption,
    RegionOption,
    StackOption,
    command_clock,
    connect,
    iso_time,
    json_line,
    on_client,
    on_stack,
    prices_in_effect,
    utc_now,
)
from spotrelay.cli.job_cost_report import ESTIMATE_NOTE, cost_command
from spotrelay.cli.job_list import (
    job_row,
    listed,
    ls_command,
    no_jobs_note,
    parse_states,
    parse_tags,
    pool_lines,
    shown_pool,
)
from spotrelay.cli.job_logs import (
    FOLLOW_END_WAIT_SECONDS,
    FOLLOW_LOOKBACK_MS,
    FOLLOW_MAX_FAILURES,
    FOLLOW_POLL_SECONDS,
    log_text,
    logs_command,
)
from spotrelay.cli.job_status import (
    WATCH_INTERVAL,
    WATCH_MIN_SECONDS,
    after_patience,
    attempts_table,
    describe_status,
    print_status,
    progress,
    status_answer,
    status_command,
    status_view,
    watch_interval,
    watch_status,
)
from spotrelay.cli.job_submit import read_stdin, submit_command
from spotrelay.cli.job_wait import (
    WAIT_MAX_FAILURES,
    WAIT_POLL_SECONDS,
    PollOption,
    Timeout,
    TimeoutOption,
    WaitResult,
    ended_line,
    wait_and_report,
    wait_command,
    wait_for_jobs,
    wait_row,
    wait_timeout,
)

__all__ = [
    "ESTIMATE_NOTE",
    "FOLLOW_END_WAIT_SECONDS",
    "FOLLOW_LOOKBACK_MS",
    "FOLLOW_MAX_FAILURES",
    "FOLLOW_POLL_SECONDS",
    "WAIT_MAX_FAILURES",
    "WAIT_POLL_SECONDS",
    "WATCH_INTERVAL",
    "WATCH_MIN_SECONDS",
    "EndpointOption",
    "JobIdArgument",
    "JsonOption",
    "PollOption",
    "RegionOption",
    "StackOption",
    "Timeout",
    "TimeoutOption",
    "WaitResult",
    "after_patience",
    "attempts_table",
    "cancel_command",
    "cancelled_line",
    "command_clock",
    "connect",
    "cost_command",
    "describe_status",
    "ended_line",
    "for_each_job",
    "iso_time",
    "job_row",
    "json_line",
    "listed",
    "log_text",
    "logs_command",
    "ls_command",
    "no_jobs_note",
    "on_client",
    "on_stack",
    "parse_states",
    "parse_tags",
    "pool_lines",
    "prices_in_effect",
    "print_status",
    "progress",
    "read_stdin",
    "resume_command",
    "resumed_line",
    "shown_pool",
    "status_answer",
    "status_command",
    "status_view",
    "submit_command",
    "utc_now",
    "wait_and_report",
    "wait_command",
    "wait_for_jobs",
    "wait_row",
    "wait_timeout",
    "watch_interval",
    "watch_status",
]
