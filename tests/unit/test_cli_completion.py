"""Shell completion: `spotrelay --install-completion / --show-completion` on the top-level command only, and
completing a command line at a job id asks no stack anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spotrelay.cli import app, job_actions, job_common, job_logs, job_status, job_submit, job_wait


def test_the_top_level_help_lists_the_completion_options() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "--install-completion" in result.stdout
    assert "--show-completion" in result.stdout


@pytest.mark.parametrize("command", ["admin", "local", "events"])
def test_the_sub_commands_do_not_offer_completion_of_their_own(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "completion" not in result.stdout


def test_show_completion_prints_the_bash_script(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the shell named rather than detected from the parent processes (typer's switch for it: what
    # `--show-completion bash` does where shellingham finds no shell)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="spotrelay", env={"SHELL": "/bin/bash"})
    # Then the script completes `spotrelay` through its completion variable
    assert result.exit_code == 0, result.output
    assert "_SPOTRELAY_COMPLETE=complete_bash" in result.stdout
    assert result.stdout.rstrip().endswith("complete -o default -F _spotrelay_completion spotrelay")


def complete(words: str) -> list[str]:
    """What bash is offered for the last word of `words` (a trailing space: a new word)."""
    parts = words.split()
    cword = len(parts) if words.endswith(" ") else len(parts) - 1
    result = CliRunner().invoke(
        app,
        [],
        prog_name="spotrelay",
        env={"_SPOTRELAY_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)},
    )
    assert result.exit_code == 0, result.output
    return result.stdout.split()


def test_completion_offers_the_commands_and_a_commands_options_after_a_job_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in (job_common, job_submit, job_status, job_logs, job_wait, job_actions):  # each command's `connect`
        monkeypatch.setattr(module, "connect", lambda *a: pytest.fail("completion may not read the stack"))
    assert {"submit", "status", "wait", "cancel", "admin"} <= set(complete("spotrelay "))
    assert complete("spotrelay st") == ["status"]
    # At a job id: nothing to offer (ids are the stack's), and nothing read to find one
    assert complete("spotrelay status ") == []
    assert complete("spotrelay wait train-0123456789ab ") == []
    # After one: the command's options, --watch and --interval among them
    assert {"--watch", "--interval", "--json", "--stack"} <= set(complete("spotrelay status train-0123456789ab --"))
    assert complete("spotrelay logs train-0123456789ab --att") == ["--attempt"]
