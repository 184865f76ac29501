"""The worker agent (`spotrelay agent`): runs one job attempt on its GPU instance, checkpoints it to
S3, and reports on the Run task's token. See `spotrelay.agent.agent` for the lifecycle.

Modules: `agent` (the loop, the notice, the report), with its parts `startup` (before the job: the attempt
record, the previous attempt, starting the job), `heartbeat`, `handover` (a migration's), `background` (periodic
and rebalance checkpoints), `output` (the job's lines forwarded) and `settings`; `main` (the wiring behind
`spotrelay agent`), `imds` (IMDSv2 client),
`checkpoints` (what changed, what to upload, restore verification; no AWS), `checkpointer` (the
order of the writes: data, manifest, pointer), `confined` (a package: the job's checkpoint dir read and
written as root without following what the job planted there), `runner` and `supervise` (the job's process),
`state` (the state file that survives a restart), `logs`, `bench` (`python -m spotrelay.agent.bench`),
`ports` (what the agent needs of AWS, as Protocols). The AWS side is `spotrelay.aws.checkpoint_storage`,
`spotrelay.aws.store` and `spotrelay.aws.task_tokens`, wired in by `main` and `bench` only.

This package's top level stays free of boto3 and pydantic imports: `python -m
spotrelay.agent.supervise` imports it, once per job, for a process that lives as long as the job.

The systemd unit the launch template's user data installs is `systemd_unit(...)` (below). Its
choices, and why:

- `Restart=on-failure`, `RestartSec=5`: a crashed agent comes back; one that reported its outcome
  exits 0 and stays down. A restarted agent reads its state file (`StateDirectory=spotrelay`, i.e.
  `/var/lib/spotrelay`) and re-attaches to the job instead of starting it again.
- `KillMode=process`: when the agent stops or crashes, systemd kills the agent only, never the job
  (which lives in the unit's cgroup too). With `control-group` or `mixed`, an agent crash would take
  the job down with it and there would be nothing to re-attach to. At shutdown the job still goes:
  the system's final kill reaches every process.
- `TimeoutStopSec=150`: a stop (the instance shutting down) lets a final checkpoint finish.
- No secrets: the unit carries the table and bucket names (and the region); the job id and attempt
  come from the instance's tags in IMDS, the task token from the attempt record in DynamoDB, read
  with the job's own credentials from the Vend function (`SPOTRELAY_VEND_FUNCTION`).
- The agent runs as root; the job as `JOB_USER` (created by user data; `--job-user`, and the agent
  refuses to start without that user). `ExecStartPre` rejects that
  user's packets to IMDS (an iptables owner match, put back on every start, a reboot included), and
  `StateDirectoryMode=0700` keeps the agent's state out of the job's reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

AGENT_UNIT_NAME = "spotrelay-agent.service"
JOB_USER = "spotrelay-job"  # the unprivileged user the job runs as on an instance
AGENT_EXEC_START = f"/opt/spotrelay/venv/bin/spotrelay agent --job-user {JOB_USER}"
IMDS_ADDRESS = "169.254.169.254"
_IMDS_RULE = f"OUTPUT -d {IMDS_ADDRESS}/32 -m owner --uid-owner {JOB_USER} -j REJECT"
# Checked first, so a restart does not add it twice; fails the start (and the agent) if it cannot be put in.
IMDS_GUARD = f"/bin/sh -c 'iptables -C {_IMDS_RULE} 2>/dev/null || iptables -I {_IMDS_RULE}'"

SYSTEMD_UNIT_TEMPLATE = """\
[Unit]
Description=spotrelay agent: runs this instance's job attempt, checkpoints it to S3, heartbeats
Wants=network-online.target
After=network-online.target docker.service

[Service]
Type=simple
{environment}{exec_start_pre}ExecStart={exec_start}
Restart=on-failure
RestartSec=5
KillMode=process
TimeoutStopSec=150
StateDirectory=spotrelay
StateDirectoryMode=0700
Environment=PYTHONUNBUFFERED=1
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
"""


def systemd_unit(
    environment: Mapping[str, str], exec_start: str = AGENT_EXEC_START, exec_start_pre: Sequence[str] = (IMDS_GUARD,)
) -> str:
    """The agent's systemd unit, with `Environment=NAME=value` lines (table, bucket, region)."""
    lines = "".join(f"Environment={name}={value}\n" for name, value in sorted(environment.items()))
    pre = "".join(f"ExecStartPre={command}\n" for command in exec_start_pre)
    return SYSTEMD_UNIT_TEMPLATE.format(environment=lines, exec_start_pre=pre, exec_start=exec_start)
