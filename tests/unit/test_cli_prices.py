"""`spotrelay prices`: what a user sees on stdout and stderr, and the exit code, with EC2's spot prices
from a stubbed client (botocore's Stubber: the prices this file chooses) or from moto (its generated ones)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from typer.testing import CliRunner, Result

from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.cli import app
from spotrelay.cli import prices as prices_module

WriteFile = Callable[[str, str], Path]

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ROW_KEYS = {
    "instance_type",
    "availability_zone",
    "gpu_model",
    "gpu_count",
    "spot_usd_per_hour",
    "spot_price_since",
    "on_demand_usd_per_hour",
    "picked",
}
# Four GPUs, T4 or L4: five catalog types fit, in the catalog's order (what EC2 is asked about)
FOUR_GPUS = "resources: {gpus: 4, gpu_models: [T4, L4]}"
FITTING = ["g4dn.12xlarge", "g4dn.metal", "g6.12xlarge", "g6.24xlarge", "g6.48xlarge"]
# EC2's answer (type, zone, $/h, hours before now the price took effect), newest first as EC2 gives it
SPOT_HISTORY = [
    ("g4dn.12xlarge", "us-east-1a", 1.20, 2),  # cheapest per hour, but a T4 does 0.52 of a V100's work
    ("g6.12xlarge", "us-east-1b", 1.50, 2),  # the L4s: cheapest per unit of work
    ("g6.12xlarge", "us-east-1a", 1.80, 1),  # the price now in 1a ...
    ("g6.12xlarge", "us-east-1a", 1.40, 3),  # ... not the one before it
    ("g4dn.metal", "us-east-1c", 2.50, 2),
    ("g5.xlarge", "us-east-1a", 0.40, 2),  # a type the job does not fit (1 A10G): never a row
]


def job(write_file: WriteFile, extra: str = "", resources: str = FOUR_GPUS) -> Path:
    return write_file("job.yaml", f"name: render\nrun: {{command: ./render.sh}}\n{resources}\n{extra}")


def history_entry(itype: str, zone: str, usd: float, hours_ago: float) -> dict[str, Any]:
    return {
        "InstanceType": itype,
        "AvailabilityZone": zone,
        "SpotPrice": f"{usd:.6f}",
        "ProductDescription": "Linux/UNIX",
        "Timestamp": NOW - timedelta(hours=hours_ago),
    }


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    """The command's EC2 client, stubbed, in us-east-1; its clock at NOW."""
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    stubber = Stubber(client)
    monkeypatch.setattr(prices_module, "ec2_client", lambda region, endpoint_url: (client, region or "us-east-1"))
    monkeypatch.setattr(prices_module, "utc_now", lambda: NOW)
    with stubber:
        yield stubber


def ec2_answers(stubber: Stubber, history: Sequence[tuple[str, str, float, float]], types: list[str] = FITTING) -> None:
    """EC2 answers one DescribeSpotPriceHistory, asked for the Linux prices of `types` in effect now."""
    stubber.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [history_entry(*entry) for entry in history]},
        {"InstanceTypes": types, "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW, "Filters": []},
    )


def prices(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["prices", *map(str, args)])


def prices_json(*args: str | Path) -> list[dict[str, Any]]:
    result = prices(*args, "--json")
    assert result.exit_code == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def offering(row: dict[str, Any]) -> str:
    return f"{row['instance_type']}:{row['availability_zone']}"


def no_ec2(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(region: str | None, endpoint_url: str | None) -> None:
        raise AssertionError("EC2 asked about bad input")

    monkeypatch.setattr(prices_module, "ec2_client", refuse)


def test_json_rows_are_the_fitting_pools_at_their_newest_price_cheapest_first(
    ec2: Stubber, write_file: WriteFile
) -> None:
    # Given EC2's spot prices for the job's types (two for one pool) and one for a type it does not fit
    ec2_answers(ec2, SPOT_HISTORY)
    # When the prices are shown as JSON
    rows = prices_json(job(write_file))
    # Then each pool the job fits is one row, at the price in effect now, cheapest first
    assert [(offering(r), r["spot_usd_per_hour"]) for r in rows] == [
        ("g4dn.12xlarge:us-east-1a", 1.20),
        ("g6.12xlarge:us-east-1b", 1.50),
        ("g6.12xlarge:us-east-1a", 1.80),
        ("g4dn.metal:us-east-1c", 2.50),
    ]
    assert all(set(r) == ROW_KEYS for r in rows)
    assert rows[2]["spot_price_since"] == (NOW - timedelta(hours=1)).isoformat()
    # And beside each, the catalog's on-demand price of its type
    assert [r["on_demand_usd_per_hour"] for r in rows] == [3.912, 4.6016, 4.6016, 7.824]
    assert (rows[0]["gpu_model"], rows[0]["gpu_count"]) == ("T4", 4)
    # And EC2 was asked exactly what the brief says (Stubber checks the parameters)
    ec2.assert_no_pending_responses()


def test_the_pick_is_placements_cheapest_per_unit_of_work_not_the_cheapest_hour(
    ec2: Stubber, write_file: WriteFile
) -> None:
    # Given T4s at $1.20/h and L4s (almost twice as fast) at $1.50/h
    ec2_answers(ec2, SPOT_HISTORY)
    # When the prices are shown
    rows = prices_json(job(write_file, "work_hours: 10"))
    # Then the one pool marked is the L4 pool placement picks, on spot
    assert [(offering(r), r["picked"]) for r in rows if r["picked"]] == [("g6.12xlarge:us-east-1b", "spot")]


def test_table_marks_the_picked_pool_and_says_why(ec2: Stubber, write_file: WriteFile) -> None:
    # Given EC2's spot prices for the job's types
    ec2_answers(ec2, SPOT_HISTORY)
    # When the prices are shown as a table
    result = prices(job(write_file, "work_hours: 10"), "--region", "us-east-1")
    # Then it exits 0; each pool is a line with its spot price, on-demand price and saving
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spot prices now in us-east-1 for job render, cheapest first")
    row = {line.split()[0] + ":" + line.split()[1]: line.split() for line in lines if line.startswith(" g")}
    assert list(row) == [
        "g4dn.12xlarge:us-east-1a",
        "g6.12xlarge:us-east-1b",
        "g6.12xlarge:us-east-1a",
        "g4dn.metal:us-east-1c",
    ]
    assert row["g6.12xlarge:us-east-1b"][2:] == ["4x", "L4", "1.5000", "4.6016", "67%", "<-", "spot"]
    assert row["g4dn.12xlarge:us-east-1a"][2:] == ["4x", "T4", "1.2000", "3.9120", "69%"]
    # And the last line names the pick, what it is expected to cost and the market choice
    assert (
        result.stdout.strip()
        .splitlines()[-1]
        .startswith("4 pools; picked: g6.12xlarge in us-east-1b (spot) at $1.5000/h, expected $")
    )
    assert "to finish (ranked by cost-to-finish); market: " in result.stdout
    assert result.stderr == ""


def test_a_deadline_that_needs_on_demand_marks_the_on_demand_pick(ec2: Stubber, write_file: WriteFile) -> None:
    # Given a job whose deadline leaves no room for a spot interruption: 2 h of work, 2.2 h to do it
    ec2_answers(ec2, SPOT_HISTORY)
    # When the prices are shown
    rows = prices_json(job(write_file, "work_hours: 2\nlimits: {deadline_hours: 2.2}"))
    # Then placement's safety net picks on-demand, and the row of that type and zone says so
    assert [(offering(r), r["picked"]) for r in rows if r["picked"]] == [("g6.12xlarge:us-east-1a", "on-demand")]


def test_prices_picks_what_place_picks_from_the_same_prices(
    ec2: Stubber, write_file: WriteFile, tmp_path: Path
) -> None:
    # Given the same spot prices from EC2 and in a PRICES.csv
    ec2_answers(ec2, SPOT_HISTORY)
    csv = tmp_path / "prices.csv"
    csv.write_text(
        "instance_type,availability_zone,spot_price_usd_per_hour,timestamp\n"
        + "".join(f"{t},{z},{p},{(NOW - timedelta(hours=h)).isoformat()}\n" for t, z, p, h in SPOT_HISTORY)
    )
    spec = job(write_file, "work_hours: 10")
    # When both commands are run
    picked = [r for r in prices_json(spec) if r["picked"]]
    placed = CliRunner().invoke(app, ["place", str(spec), "--prices", str(csv), "--json"])
    # Then they pick the same pool
    assert placed.exit_code == 0, placed.stderr
    best = json.loads(placed.stdout)["ranked"][0]
    assert [(offering(r), r["picked"]) for r in picked] == [(offering(best), best["market"])]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "error: --gpus: Input should be greater than or equal to 1 (got 0)"),
        (["--gpus", "9"], "error: --gpus: no EC2 GPU instance type has 9 GPUs; allowed 1..8"),
        (["--gpus", "1", "--gpu-memory", "500"], "error: --gpu-memory: no accepted GPU has 500 GiB"),
        (["--gpu-memory", "16"], "error: --gpu-memory needs --gpus N"),
        ([], "error: give a JOB.yaml, or --gpus N"),
    ],
)
def test_bad_options_exit_2_with_one_line_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    # Given options no job can have (EC2 is never asked)
    no_ec2(monkeypatch)
    # When the prices are asked for
    result = prices(*args)
    # Then it exits 2 with one error line naming the option, and nothing on stdout
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(message)
    assert len(result.stderr.splitlines()) == 1


def test_a_binary_job_file_exits_2_naming_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Given a job file that is not text
    no_ec2(monkeypatch)
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\x00\xff\xfe\x89PNG")
    # When the prices are asked for
    result = prices(binary)
    # Then it exits 2 with one line naming the file
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: {binary}: holds a NUL byte (at byte 0): a binary file, not a job spec (YAML or JSON text)\n"
    )
    assert result.stdout == ""


def test_a_job_file_and_gpus_together_exit_2(monkeypatch: pytest.MonkeyPatch, write_file: WriteFile) -> None:
    no_ec2(monkeypatch)
    result = prices(job(write_file), "--gpus", "1")
    assert result.exit_code == 2
    assert result.stderr == "error: give JOB.yaml or --gpus/--gpu-memory, not both\n"


def test_gpus_alone_asks_for_every_type_with_that_many_gpus(ec2: Stubber) -> None:
    # Given --gpus 8 --gpu-memory 80: the 8-GPU types with 80 GiB GPUs or more
    types = [t.name for t in INSTANCE_TYPES.values() if t.gpu_count >= 8 and t.gpu_memory_gib >= 80]
    ec2_answers(ec2, [("p5.48xlarge", "us-east-1a", 30.0, 1)], types=types)
    # When the prices are shown
    rows = prices_json("--gpus", "8", "--gpu-memory", "80")
    # Then EC2 was asked about those types, and its one quote is the row placement picks
    assert [(offering(r), r["picked"]) for r in rows] == [("p5.48xlarge:us-east-1a", "spot")]
    assert rows[0]["on_demand_usd_per_hour"] == INSTANCE_TYPES["p5.48xlarge"].on_demand_usd_per_hour


def test_no_quoted_pool_that_fits_exits_1(ec2: Stubber, write_file: WriteFile) -> None:
    # Given EC2 quotes only a type the job does not fit
    ec2_answers(ec2, [("g5.xlarge", "us-east-1a", 0.40, 2)])
    # When the prices are asked for
    result = prices(job(write_file))
    # Then it exits 1 saying no pool fits, and prints no table
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        "error: no pool fits job render: EC2 quotes no spot price in us-east-1 for the 5 type(s) that fit "
        "(g4dn.12xlarge, g4dn.metal, g6.12xlarge, g6.24xlarge, g6.48xlarge)"
    )


def test_a_price_cap_below_every_pool_shows_the_prices_and_why_none_is_picked(
    ec2: Stubber, write_file: WriteFile
) -> None:
    # Given a job that pays at most $1/h, and every pool dearer
    ec2_answers(ec2, SPOT_HISTORY)
    # When the prices are shown
    result = prices(job(write_file, "limits: {max_price_per_hour: 1.0}"))
    # Then the pools are still shown (they fit), none marked, and the last line says why
    assert result.exit_code == 0, result.stderr
    assert "<-" not in result.stdout
    assert "4 pools; no pool can take the job now: 4 price-cap" in result.stdout


def test_ec2_refusing_exits_1_with_its_error(ec2: Stubber, write_file: WriteFile) -> None:
    # Given credentials without ec2:DescribeSpotPriceHistory
    ec2.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "You are not authorized")
    # When the prices are asked for
    result = prices(job(write_file))
    # Then it exits 1 with EC2's error on one line
    assert result.exit_code == 1
    assert result.stderr == (
        "error: EC2 in us-east-1 refused DescribeSpotPriceHistory: UnauthorizedOperation: You are not authorized\n"
    )


def test_an_endpoint_that_does_not_answer_exits_1(monkeypatch: pytest.MonkeyPatch, write_file: WriteFile) -> None:
    # Given an endpoint URL where nothing listens (a port just freed)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    # When the prices are asked for there
    result = prices(job(write_file), "--region", "us-east-1", "--endpoint-url", url)
    # Then it exits 1 saying EC2 could not be reached there
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot read spot prices from EC2 in us-east-1 at {url}: Could not connect")
    assert result.stdout == ""


def test_a_bad_endpoint_url_exits_2(monkeypatch: pytest.MonkeyPatch, write_file: WriteFile) -> None:
    result = prices(job(write_file), "--region", "us-east-1", "--endpoint-url", "localhost 5055")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --endpoint-url localhost 5055: ")


def test_moto_quotes_every_zone_of_the_region(monkeypatch: pytest.MonkeyPatch, write_file: WriteFile) -> None:
    # Given moto's EC2 (a price for every type it offers in every zone of eu-west-1)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        # When the prices are shown there
        rows = prices_json(job(write_file), "--region", "eu-west-1")
        table = prices(job(write_file), "--region", "eu-west-1")
    # Then the rows are the job's types in eu-west-1's zones, each priced on-demand from the catalog
    assert rows
    assert {r["instance_type"] for r in rows} <= set(FITTING)
    assert {r["availability_zone"][:-1] for r in rows} == {"eu-west-1"}
    assert all(r["on_demand_usd_per_hour"] == INSTANCE_TYPES[r["instance_type"]].on_demand_usd_per_hour for r in rows)
    # And exactly one pool is marked; the table says the on-demand prices are the catalog's us-east-1 ones
    assert len([r for r in rows if r["picked"]]) == 1
    assert table.exit_code == 0, table.stderr
    assert table.stdout.rstrip().endswith("on-demand: the catalog's us-east-1 prices")
