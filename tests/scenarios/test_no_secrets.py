"""No secret in any log line of a replay: the functions' lines (at INFO, as a deployment logs them) and the
agents' (as the agent writes them on an instance) hold no task token and no credential.

The replay runs in a fresh interpreter: Powertools configures a service's logger (its level, its stream)
once per process, so a worker that already replayed at the quiet level would log nothing here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import REPO_ROOT, SCENARIOS

SCRIPT = r"""
import json, logging, sys
from pathlib import Path
from spotrelay.agent.logs import JsonLineFormatter
from spotrelay.local import workers
from spotrelay.local.replay import Replay
from spotrelay.local.scenario import load_scenario

agent_lines = []
formatter = JsonLineFormatter()
emit = workers.AgentLogbook.emit


def keep(self, record):
    agent_lines.append(formatter.format(record))
    emit(self, record)


workers.AgentLogbook.emit = keep


def secrets_in(value):
    found = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("SecretAccessKey", "SessionToken", "secret_key", "token") and isinstance(inner, str):
                found.append(inner)
            found += secrets_in(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            found += secrets_in(inner)
    return found


run = Replay(load_scenario(sys.argv[1]), template=Path(sys.argv[2]), function_log_level="INFO")
result = run.run()
invocations = run.runtime.lambdas.invocations
json.dump(
    {
        "passed": result.passed,
        "function_output": run.function_output.getvalue(),
        "agent_lines": agent_lines,
        "timeline": [e.text for e in result.timeline],
        "tokens": sorted({i.event["task_token"] for i in invocations if "task_token" in (i.event or {})}),
        "credentials": sorted({s for i in invocations for s in secrets_in(i.result)}),
    },
    sys.stdout,
)
"""


def test_no_task_token_or_credential_appears_in_any_log_line_of_a_replay(synthesized_template: Path) -> None:
    # Given a replay with an interruption and a relaunch, the functions logging at INFO
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SCENARIOS / "interruption-relaunch.yaml"), str(synthesized_template)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["passed"]
    # The secrets: every Run task's token, every credential a function handed out
    tokens, credentials = seen["tokens"], seen["credentials"]
    assert len(tokens) >= 2  # the first attempt's and the relaunch's
    assert credentials  # each agent's job credentials, from the vend function
    # The lines are there (a test that read nothing would prove nothing) ...
    assert '"message":"launched"' in seen["function_output"].replace(" ", "")
    assert any("checkpoint" in line for line in seen["agent_lines"])
    # ... and hold no secret
    everything = "\n".join([seen["function_output"], *seen["agent_lines"], *seen["timeline"]])
    leaked = sorted(secret[:12] + "..." for secret in [*tokens, *credentials] if secret in everything)
    assert leaked == []
