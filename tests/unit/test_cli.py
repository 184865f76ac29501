"""`spotrelay place`: what a user sees on stdout and stderr, and the exit code.

This typer/click (click >= 8.2) always keeps stderr apart in CliRunner: `result.stdout` is what the user
pipes on, `result.stderr` the error line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from spotrelay.cli import app

WriteFile = Callable[[str, str], Path]

RANKED_KEYS = {"instance_type", "availability_zone", "market", "hourly_price", "expected_cost_to_finish"}
REJECTED_KEYS = {"instance_type", "availability_zone", "reason"}


@pytest.fixture
def job_file(events_dir: Path) -> Path:
    return events_dir / "jobs" / "resnet50.yaml"


@pytest.fixture
def price_file(events_dir: Path) -> Path:
    return events_dir / "prices" / "us-east-1-example.csv"


def place(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["place", *map(str, args)])


def place_json(job_file: Path, price_file: Path, *extra: str) -> dict[str, Any]:
    result = place(job_file, "--prices", price_file, "--json", *extra)
    assert result.exit_code == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def offering(row: dict[str, Any]) -> str:
    return f"{row['instance_type']}:{row['availability_zone']}"


def test_json_ranking_has_exactly_the_documented_shape(job_file: Path, price_file: Path) -> None:
    # Given the example job and price table
    # When the pools are ranked as JSON
    document = place_json(job_file, price_file)

    # Then stdout is one JSON object of ranked and rejected pools, with exactly the documented keys
    assert set(document) == {"ranked", "rejected"}
    assert document["ranked"], "the example job fits some pool"
    assert document["rejected"], "the example table holds pools the job cannot use"
    assert all(set(row) == RANKED_KEYS for row in document["ranked"])
    assert all(set(row) == REJECTED_KEYS for row in document["rejected"])
    assert {row["market"] for row in document["ranked"]} == {"spot"}


def test_json_ranking_is_cheapest_to_finish_first(job_file: Path, price_file: Path) -> None:
    # Given the example job and price table
    # When the pools are ranked as JSON
    ranked = place_json(job_file, price_file)["ranked"]

    # Then the expected cost to finish never decreases down the list
    costs = [row["expected_cost_to_finish"] for row in ranked]
    assert len(costs) > 1
    assert costs == sorted(costs)


def test_non_gpu_type_is_rejected(job_file: Path, price_file: Path) -> None:
    # Given a price table that also lists m5.xlarge, a type with no GPU
    # When the pools are ranked as JSON
    document = place_json(job_file, price_file)

    # Then m5.xlarge is rejected as not a GPU type, and not ranked
    (m5,) = [row for row in document["rejected"] if row["instance_type"] == "m5.xlarge"]
    assert m5 == {
        "instance_type": "m5.xlarge",
        "availability_zone": "us-east-1a",
        "reason": "not a GPU instance type in the catalog",
    }
    assert all(row["instance_type"] != "m5.xlarge" for row in document["ranked"])


def test_no_ranked_pool_costs_more_per_hour_than_the_job_allows(job_file: Path, price_file: Path) -> None:
    # Given the example job (max_price_per_hour 3.0) and a table where every p4d.24xlarge costs more
    # When the pools are ranked as JSON
    document = place_json(job_file, price_file)

    # Then every ranked pool is within the cap, and the p4d pools are rejected for their price
    assert all(row["hourly_price"] <= 3.0 for row in document["ranked"])
    p4d = [row for row in document["rejected"] if row["instance_type"] == "p4d.24xlarge"]
    assert len(p4d) == 6
    assert all("above max_price_per_hour $3" in row["reason"] for row in p4d)


def test_ranking_uses_the_latest_price_of_each_pool(job_file: Path, price_file: Path) -> None:
    # Given the example table, whose g6.xlarge us-east-1a pool also has an older, cheaper row
    # When the pools are ranked as JSON
    ranked = place_json(job_file, price_file)["ranked"]

    # Then that pool is ranked once, at its latest price
    (g6,) = [row for row in ranked if offering(row) == "g6.xlarge:us-east-1a"]
    assert g6["hourly_price"] == 0.5117


def test_blocking_the_first_choice_moves_it_to_the_rejected(job_file: Path, price_file: Path) -> None:
    # Given the ranking of the example job
    before = place_json(job_file, price_file)["ranked"]
    first, second = offering(before[0]), offering(before[1])

    # When the first choice is blocked
    after = place_json(job_file, price_file, "--blocked", first)

    # Then it is no longer ranked, the runner-up leads, and it is rejected as blocked
    assert first not in [offering(row) for row in after["ranked"]]
    assert offering(after["ranked"][0]) == second
    assert len(after["ranked"]) == len(before) - 1
    instance_type, zone = first.split(":")
    assert {
        "instance_type": instance_type,
        "availability_zone": zone,
        "reason": "pool blocked after a recent loss",
    } in after["rejected"]


def test_explain_says_which_pool_was_chosen(job_file: Path, price_file: Path) -> None:
    # Given the example job and price table
    # When the pools are ranked with --explain
    result = place(job_file, "--prices", price_file, "--explain")

    # Then the output has a "chosen:" line naming the cheapest-to-finish pool
    assert result.exit_code == 0, result.stderr
    chosen = [line for line in result.stdout.splitlines() if line.startswith("chosen: ")]
    assert len(chosen) == 1
    assert chosen[0].startswith("chosen: g4dn.xlarge in us-east-1e (spot) at $0.1565/h")
    assert "pools for resnet50, best first" in result.stdout


def test_explain_with_json_keeps_stdout_parseable(job_file: Path, price_file: Path) -> None:
    # Given the example job and price table
    # When the pools are ranked as JSON with --explain
    result = place(job_file, "--prices", price_file, "--json", "--explain")

    # Then stdout is still only the JSON, and the explanation (with its "chosen:" line) goes to stderr
    assert result.exit_code == 0, result.stderr
    first = json.loads(result.stdout)["ranked"][0]
    assert f"chosen: {first['instance_type']} in {first['availability_zone']} (spot)" in result.stderr


def test_bad_job_file_is_one_error_line_naming_file_and_field(write_file: WriteFile, price_file: Path) -> None:
    # Given a job file that asks for zero GPUs
    bad_job = write_file("job.yaml", "name: train\nrun: {command: python train.py}\nresources: {gpus: 0}\n")

    # When it is placed
    result = place(bad_job, "--prices", price_file)

    # Then the command fails with one line that names the file and the field, and prints no ranking
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {bad_job}: resources.gpus: ")
    assert result.stderr.count("\n") == 1


def test_bad_price_file_names_file_and_line(job_file: Path, write_file: WriteFile) -> None:
    # Given a price table whose second data row (line 3) has no number for the price
    bad_prices = write_file(
        "prices.csv",
        "instance_type,availability_zone,spot_price_usd_per_hour\ng6.xlarge,us-east-1a,0.4\ng5.xlarge,us-east-1a,n/a\n",
    )

    # When the job is placed against it
    result = place(job_file, "--prices", bad_prices)

    # Then the command fails with one line naming the file and the line
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr == f"error: {bad_prices}: line 3: spot_price_usd_per_hour 'n/a' is not a number\n"


def test_malformed_blocked_pool_is_refused(job_file: Path, price_file: Path) -> None:
    # Given a --blocked value that is not TYPE:AZ
    # When the job is placed
    result = place(job_file, "--prices", price_file, "--blocked", "nonsense")

    # Then the command fails, says the form expected, and prints no ranking
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr == "error: --blocked 'nonsense': expected TYPE:AZ, e.g. g6.xlarge:us-east-1a\n"


def test_installed_console_script_ranks_the_example(repo_root: Path) -> None:
    # Given the installed `spotrelay` entry point, run from the checkout as the README does
    script = Path(sys.executable).with_name("spotrelay")

    # When it ranks the example job as JSON
    completed = subprocess.run(
        [
            str(script),
            "place",
            "events/jobs/resnet50.yaml",
            "--prices",
            "events/prices/us-east-1-example.csv",
            "--json",
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    # Then it exits 0 and prints the JSON ranking
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    assert set(document) == {"ranked", "rejected"}
    assert document["ranked"][0]["instance_type"] == "g4dn.xlarge"
