"""`spotrelay bench --workload`: what a user sees when a workload file (or the inputs of a built-in workload)
cannot make a sensible benchmark, and what the workloads say about themselves.

Traces here are one-hour ticks of p3.2xlarge (label v100_1) availability, like tests/unit/test_bench.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from test_bench import bench, trace_json

from spotrelay.bench.workloads import WorkloadError, fleet, load_inputs, load_workload_file

JOB = "{name: train-a, resources: {gpus: 1}, work_hours: 6, limits: {deadline_hours: 9}"


def traces(directory: Path, hours: int, labels: Sequence[str] = ("v100_1",)) -> Path:
    """Always-available traces of `hours` one-hour ticks in us-east-1a and us-west-2a, one per label."""
    directory.mkdir()
    for zone in ("us-east-1a", "us-west-2a"):
        for label in labels:
            (directory / f"{zone}_{label}.json").write_text(trace_json([1] * hours))
    return directory


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    return traces(tmp_path / "traces", 100)


def workload_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


def refusal(path: Path, trace_dir: Path) -> str:
    """The message a workload file is refused with."""
    with pytest.raises(WorkloadError) as refused:
        load_workload_file(path, load_inputs([trace_dir]))
    return str(refused.value)


# ------------------------------------------------------------------------------- 1. deadlines and work


def test_a_deadline_shorter_than_the_work_on_the_workloads_types_is_refused(trace_dir: Path, tmp_path: Path) -> None:
    # Given a job of 20 h of work with a 10 h deadline: `spotrelay submit` takes it (an H100 does the work in
    # 2.5 h), but the traces hold V100s only
    path = workload_file(
        tmp_path, "jobs:\n  - {name: train-a, resources: {gpus: 1}, work_hours: 20, limits: {deadline_hours: 10}}\n"
    )

    # When the workload is built
    message = refusal(path, trace_dir)

    # Then it is refused, naming the file, the entry, the field and the fastest GPU it may use
    assert message.startswith(f"{path}: jobs[0] (train-a): limits.deadline_hours: 10 h is shorter than the work: ")
    assert "at least 20.10 h on V100" in message  # 20 h of work + the default 6 min restart overhead


def test_a_deadline_that_leaves_no_time_for_the_first_start_is_refused(trace_dir: Path, tmp_path: Path) -> None:
    # Given a deadline equal to the work: even on-demand from the start pays the restart overhead first
    path = workload_file(
        tmp_path,
        "jobs:\n  - {name: tight, resources: {gpus: 1}, work_hours: 6, limits: {deadline_hours: 6}, "
        "restart_overhead: 12m}\n",
    )

    # When / Then: refused, with the overhead counted
    assert "limits.deadline_hours: 6 h is shorter than the work: work_hours 6 and the 0.2 h restart" in refusal(
        path, trace_dir
    )


def test_the_job_specs_own_errors_name_the_entry(trace_dir: Path, tmp_path: Path) -> None:
    # Given the same job limited to V100s, which `spotrelay submit` refuses too
    path = workload_file(
        tmp_path,
        "jobs:\n  - {name: train-a, resources: {gpus: 1, gpu_models: [V100]}, work_hours: 20, "
        "limits: {deadline_hours: 10}}\n",
    )

    # When / Then: the spec's message, under the file and the entry with its name
    assert refusal(path, trace_dir).startswith(f"{path}: jobs[0] (train-a): limits.deadline_hours: 10 h is shorter")


def test_a_job_that_fits_its_deadline_is_built(trace_dir: Path, tmp_path: Path) -> None:
    # Given a job whose deadline leaves just the work and one restart overhead
    path = workload_file(
        tmp_path,
        "jobs:\n  - {name: fits, resources: {gpus: 1}, work_hours: 6, limits: {deadline_hours: 6.1}, "
        "restart_overhead: 6m}\n",
    )

    # When the workload is built
    [job] = load_workload_file(path, load_inputs([trace_dir])).jobs

    # Then the job is there as written
    assert (job.name, job.work_hours, job.deadline_hours) == ("fits", 6, 6.1)


# ------------------------------------------------------------------------------ 2. within the traces


@pytest.mark.parametrize(
    ("bench_keys", "expected"),
    [
        (
            "submit: 5000h",
            "jobs[0] (train-a): submit: 5000 h is not before the end of the market: the traces span 100.0 h",
        ),
        (
            "submit: 100h",
            "jobs[0] (train-a): submit: 100 h is not before the end of the market: the traces span 100.0 h",
        ),
        (
            "submit: 95h",
            "jobs[0] (train-a): limits.deadline_hours: the deadline falls at 104 h (submit 95 h + 9 h), after the end "
            "of the market: the traces span 100.0 h",
        ),
        (
            "repeat: {count: 10, every: 24h}",
            "jobs[0] (train-a): repeat: copy 10 is submitted at 216 h and its deadline falls at 225 h, after the end "
            "of the market: the traces span 100.0 h",
        ),
    ],
)
def test_a_job_whose_deadline_ends_after_the_traces_is_refused(
    trace_dir: Path, tmp_path: Path, bench_keys: str, expected: str
) -> None:
    # Given a job submitted (or repeated) so that its deadline ends after the 100 h traces
    path = workload_file(tmp_path, f"jobs:\n  - {JOB}, {bench_keys}}}\n")

    # When the workload is built
    message = refusal(path, trace_dir)

    # Then it is refused with the traces' span and the trace that limits it
    assert message.startswith(f"{path}: {expected}, limited by the trace {trace_dir}/")


def test_a_repeat_that_overruns_the_traces_says_how_many_copies_fit(trace_dir: Path, tmp_path: Path) -> None:
    path = workload_file(tmp_path, f"jobs:\n  - {JOB}, repeat: {{count: 10, every: 24h}}}}\n")

    # 0, 24, 48, 72 h: the deadline of the copy at 72 h ends at 81 h; the one at 96 h would end at 105 h
    assert refusal(path, trace_dir).endswith("at most 4 copies every 24 h fit")


def test_a_job_whose_deadline_ends_with_the_traces_is_built(trace_dir: Path, tmp_path: Path) -> None:
    path = workload_file(tmp_path, f"jobs:\n  - {JOB}, submit: 91h}}\n")

    [job] = load_workload_file(path, load_inputs([trace_dir])).jobs

    assert job.deadline_at == pytest.approx(100)


# ------------------------------------------------------------------------------------------- 3. prices


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        (
            "spot_price_usd_per_hour: -1",
            "spot_price_usd_per_hour: -1 is not a price; allowed: USD per hour, a number >= 0",
        ),
        (
            "spot_price_usd_per_hour: {p3.2xlarge: -1}",
            'spot_price_usd_per_hour["p3.2xlarge"]: -1 is not a price; allowed: USD per hour, a number >= 0',
        ),
        (
            "spot_price_usd_per_hour: cheap",
            "spot_price_usd_per_hour: 'cheap' is not a price; allowed: a number >= 0, or {instance type: number}",
        ),
        (
            "on_demand_usd_per_hour: {p3.2xlarge: 0}",
            'on_demand_usd_per_hour["p3.2xlarge"]: 0 is not a price; allowed: USD per hour, a number > 0',
        ),
        (
            "on_demand_usd_per_hour: {p3.2xlarg: 3.06}",
            'on_demand_usd_per_hour["p3.2xlarg"]: not an instance type in the catalog',
        ),
    ],
)
def test_a_price_that_is_not_a_price_is_one_line_naming_the_field(
    trace_dir: Path, tmp_path: Path, prices: str, expected: str
) -> None:
    # Given a workload file with a bad price
    path = workload_file(tmp_path, f"{prices}\njobs:\n  - {JOB}}}\n")

    # When the bench runs it
    result = bench("--traces", trace_dir, "--workload", path, "--processes", "1")

    # Then it exits with one line that names the field and says what is allowed, and no traceback
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr == f"error: {path}: {expected}\n"


# ------------------------------------------------------------------------------------- 4. the messages


def test_an_unknown_key_of_a_job_entry_lists_the_benchs_keys_too(trace_dir: Path, tmp_path: Path) -> None:
    path = workload_file(tmp_path, f"jobs:\n  - {JOB}, submitt: 2h}}\n")

    message = refusal(path, trace_dir)

    assert message.startswith(
        f"{path}: jobs[0] (train-a): submitt: unknown key (did you mean submit?); allowed keys here: name, "
    )
    assert message.endswith("submit, restart_overhead, checkpoint_on_notice, zones, per_zone, repeat (the bench)")


def test_an_unknown_top_level_key_says_which_keys_are_allowed(trace_dir: Path, tmp_path: Path) -> None:
    path = workload_file(tmp_path, f"nmae: nightly\njobs:\n  - {JOB}}}\n")

    assert refusal(path, trace_dir) == (
        f"{path}: nmae: unknown key (did you mean name?); allowed keys here: name, description, instance_types, zones, "
        "spot_price_usd_per_hour, on_demand_usd_per_hour, jobs"
    )


def test_the_benchs_keys_are_located_as_the_job_specs_are(trace_dir: Path, tmp_path: Path) -> None:
    # Given a bad bench key and a bad key of `repeat` in the second entry
    path = workload_file(tmp_path, f"jobs:\n  - {JOB}}}\n  - {JOB}, submit: soon, repeat: {{count: 2, evry: 1h}}}}\n")

    # When / Then: both under `jobs[1] (train-a)`, as the spec's own fields are, never `jobs.1.submit`
    assert refusal(path, trace_dir) == (
        f"{path}: jobs[1] (train-a): submit: 'soon' is not a duration (use e.g. 2h, 90m, 30s, 1h30m, 1.5d, or a "
        "number of hours); jobs[1] (train-a): repeat.evry: unknown key (did you mean every?); allowed keys here: "
        "count, every"
    )


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        ("instance_types: [p4d.24xlarge]", "no traced pool matches its zones (all) and instance_types (p4d.24xlarge)"),
        ("zones: [us-east-1b]", "zones: us-east-1b not traced; traced zones: us-east-1a, us-west-2a"),
    ],
)
def test_a_selection_of_no_traced_pool_says_what_is_traced(tmp_path: Path, selection: str, expected: str) -> None:
    trace_dir = traces(tmp_path / "traces", 100, labels=("v100_1", "v100_8"))
    path = workload_file(tmp_path, f"{selection}\njobs:\n  - {JOB}}}\n")

    message = refusal(path, trace_dir)

    assert message.startswith(f"{path}: {expected}")
    if "no traced pool" in expected:
        assert message.endswith("; traced: p3.16xlarge in us-east-1a, us-west-2a; p3.2xlarge in us-east-1a, us-west-2a")


# ---------------------------------------------------------------------------------------------- 5, 6. fleet


def test_fleet_says_the_price_history_limits_its_span(tmp_path: Path) -> None:
    # Given 200 h of traces and a price history (training-on-a-dime's format) whose changes span 12 h
    trace_dir = traces(tmp_path / "traces", 200)
    prices = tmp_path / "history.csv"
    prices.write_text(
        "timestamp_utc,region,availability_zone,instance_type,gpu_model,gpu_count,product_description,"
        "spot_price_usd_per_hour\n"
        "2026-11-30T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,V100,1,Linux/UNIX,0.9\n"
        "2026-11-30T00:00:00Z,us-west-2,us-west-2a,p3.2xlarge,V100,1,Linux/UNIX,1.0\n"
        "2026-11-30T12:00:00Z,us-east-1,us-east-1a,p3.2xlarge,V100,1,Linux/UNIX,0.95\n"
    )

    # When fleet is built on them
    with pytest.raises(WorkloadError) as refused:
        fleet(load_inputs([trace_dir], prices=prices))

    # Then the message says the price history is what falls short
    assert str(refused.value) == (
        f"fleet needs traces and prices spanning 120 h; the traces and prices span 12.0 h, limited by the prices in "
        f"{prices} (its timestamps run from 2026-11-30 00:00 to 2026-11-30 12:00 UTC)"
    )


def test_a_prices_csv_snapshot_does_not_limit_fleets_span(tmp_path: Path) -> None:
    # Given 200 h of traces and a `spotrelay place` PRICES.csv whose rows were read 12 h apart
    trace_dir = traces(tmp_path / "traces", 200)
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "instance_type,availability_zone,spot_price_usd_per_hour,timestamp\n"
        "p3.2xlarge,us-east-1a,0.9,2026-11-30T00:00:00Z\n"
        "p3.2xlarge,us-west-2a,1.0,2026-11-30T12:00:00Z\n"
    )

    # When fleet is built on them
    workload = fleet(load_inputs([trace_dir], prices=prices), count=20)

    # Then it is built: a snapshot's prices hold after its last row
    assert len(workload.jobs) == 20


def test_fleet_says_which_trace_limits_its_span(trace_dir: Path) -> None:
    with pytest.raises(WorkloadError) as refused:
        fleet(load_inputs([trace_dir]))

    assert str(refused.value).startswith(
        f"fleet needs traces and prices spanning 120 h; the traces span 100.0 h, limited by the trace {trace_dir}/"
    )


@pytest.mark.parametrize(
    ("labels", "gpus"),
    [
        (("v100_1",), "1 GPU per job (no traced spot type has more than 1)"),
        (("v100_1", "v100_8"), "GPUs 1/4/8"),
    ],
)
def test_fleets_description_gives_the_gpu_counts_it_drew(tmp_path: Path, labels: Sequence[str], gpus: str) -> None:
    # Given 200 h of traces of 1-GPU pools only (or of 1- and 8-GPU pools)
    trace_dir = traces(tmp_path / "traces", 200, labels)

    # When fleet is built
    workload = fleet(load_inputs([trace_dir]))

    # Then its description gives the GPU counts of its jobs
    drawn = sorted({job.spec.resources.gpus for job in workload.jobs})
    assert f"; {gpus}, work 2-48 h" in workload.description
    assert drawn == ([1] if len(labels) == 1 else [1, 4, 8])


# ------------------------------------------------------------------------------------------ job names


def test_copies_are_named_by_their_number_and_per_zone_copies_by_their_zone(trace_dir: Path, tmp_path: Path) -> None:
    # Given a job repeated 3 times, and another run once per zone
    path = workload_file(
        tmp_path,
        "jobs:\n"
        "  - {name: train-a, resources: {gpus: 1}, work_hours: 6, limits: {deadline_hours: 9},"
        " repeat: {count: 3, every: 10h}}\n"
        "  - {name: train-b, resources: {gpus: 1}, work_hours: 6, limits: {deadline_hours: 9}, per_zone: true}\n",
    )

    # When the workload is built
    workload = load_workload_file(path, load_inputs([trace_dir]))

    # Then a copy's name says which copy it is, and a per-zone copy its zone (and no zone where there is none)
    assert [job.name for job in workload.jobs] == [
        "train-a-0",
        "train-a-1",
        "train-a-2",
        "train-b-us-east-1a",
        "train-b-us-west-2a",
    ]
