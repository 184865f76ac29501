"""Every parser of untrusted input, fuzzed on a fixed budget: the job-spec reader (text, bytes and decoded
documents), the ec2-events function (EC2 and alarm events), the dispatcher's reading of a queue message, the
replay's scenarios and event files, and the bench's workload files.

Property: for any input (random text and bytes, random JSON-like structures, and the valid documents of
`events/` with values deleted, renamed, or replaced by hostile ones: huge integers, NaN and infinities, deep
nesting, unpaired surrogates, NUL, very long strings, wrong types) the parser returns a valid result or raises
its own clear error, never another exception; and one input takes under a second of CPU time and 100 MB of
memory. The bounds are gross (a parser gone quadratic, an alias bomb expanded), measured in process CPU time,
never on the wall clock. The examples are derandomized: every run tries the same inputs.

Then plain regression tests, one per bug the fuzzing found, each failing without its fix.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import math
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from control_builders import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotrelay.bench.workloads import BenchInputs, Workload, WorkloadError, load_inputs, load_workload_file
from spotrelay.config import ENV_BLOCK_MINUTES, ENV_STATE_MACHINE_ARN, ENV_TABLE
from spotrelay.control.dispatcher import MAX_REASON_CHARS, Refusal, printable, read_submission
from spotrelay.control.ports import QueueMessage
from spotrelay.field_problems import MAX_PROBLEM_CHARS
from spotrelay.local.scenario import Scenario, ScenarioError, injections, load_scenario, parse_scenario, submissions
from spotrelay.models import JobSpec, JobSpecError, load_job_spec, parse_job_spec
from spotrelay.models.job_spec import decode_document, decode_json, document_text

# --- the bounds, and how one input is run within them ---------------------------------------------------------

CPU_SECONDS_MAX = 1.0
PEAK_BYTES_MAX = 100 * 1024 * 1024


def within_bounds(parse: Callable[[], Any], *clear_errors: type[BaseException]) -> Any:
    """What `parse()` returns, or the clear error it raises (any other exception fails the example). Fails
    too if one call takes more than CPU_SECONDS_MAX of this thread's CPU time or PEAK_BYTES_MAX at its peak.
    Called to be timed, then traced (tracemalloc makes pure-Python parsing several times slower). The CPU
    time is this thread's alone (the worker's other threads, left by earlier tests, do not count), and the
    least of up to three calls: a collection of the whole heap that one call happens to trigger is not the
    input's cost, while an input that is slow to parse is slow every time."""
    cpu = math.inf
    for _ in range(3):
        started = time.thread_time()
        outcome = _outcome(parse, clear_errors)
        cpu = min(cpu, time.thread_time() - started)
        if cpu < CPU_SECONDS_MAX:
            break
    assert cpu < CPU_SECONDS_MAX, f"one input took {cpu:.2f} s of CPU, three times"
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    try:
        _outcome(parse, clear_errors)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    assert peak - before < PEAK_BYTES_MAX, f"one input took {(peak - before) / 2**20:.0f} MiB"
    return outcome


def _outcome(parse: Callable[[], Any], clear_errors: tuple[type[BaseException], ...]) -> Any:
    try:
        return parse()
    except clear_errors as e:
        return e


def fuzzed(examples: int) -> Callable[[Any], Any]:
    """This file's Hypothesis settings: `examples` inputs, the same ones every run, no example database
    written, no deadline (the bounds are `within_bounds`'). The fixtures the tests take (the events
    directory, a temporary directory, a trace directory) serve every input alike."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# --- hostile values, and the strategies made of them ------------------------------------------------------------

HOSTILE_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",  # unpaired surrogates
    "\udfff",
    "x\udc80y",
    "\u2028\u2029",
    "\ufeff",
    "\x85\x1b[31m\x7f",
    "\uffff\U0010ffff",
    "x" * 100_000,
    "é" * 30_000,
    "9" * 5_000,
    "-1e999",
    "NaN",
    "--privileged",
    "../../etc",
    "/",
    "1:30",
    "010",
    "yes",
    "2024-13-45",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+14:00",
    "i-" + "f" * 10_000,
    "&a [*a]",
    "!!python/object/apply:os.system [ls]",
    '"\\U00110000"',
]
# Times the parsers reckon with: the calendar's ends (with the offsets that take them past it), no zone, no date
HOSTILE_TIMES = ["9999-12-31T23:59:59Z", 253402300799, "0001-01-01T00:00:00+14:00", "2026-11-30T12:00:00"]
HOSTILE_TIMES += ["2026-02-30T00:00:00Z", -62135596800, 1e300, "1e300h"]
TIME_KEYS = frozenset({"time", "start", "timestamp", "at", "from", "to", "horizon", "submit", "every"})
HOSTILE_NUMBERS = [10**1000, -(10**4000), 2**63, -(2**64) - 1, float("nan"), float("inf"), float("-inf")]
HOSTILE_NUMBERS += [-0.0, 1e308, 5e-324, 1e300, 0, -1]
# Keys the parsers know, so that random structures get past their first check
KNOWN_KEYS = [
    *("name", "run", "resources", "image", "command", "env", "gpus", "gpu_memory_gib", "gpu_models", "min_vcpus"),
    *("checkpoint", "dir", "interval_minutes", "limits", "deadline_hours", "work_hours", "priority", "tags"),
    *("placement", "recovery", "strategy", "version", "id", "source", "detail-type", "detail", "time", "account"),
    *("region", "instance-id", "instance-action", "state", "alarmName", "start", "horizon", "seed", "stack"),
    *("market", "jobs", "events", "expect", "faults", "spec", "file", "body", "at", "count", "instance", "job"),
    *("attempt", "spotrelay", "submit", "repeat", "every", "zones", "per_zone", "restart_overhead"),
    *("instance_types", "spot_price_usd_per_hour", "on_demand_usd_per_hour", "prices", "outages", "kind"),
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(HOSTILE_TEXT),
    st.sampled_from(HOSTILE_NUMBERS),
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12), st.sampled_from(HOSTILE_TEXT))


def hostile_for(key: Any) -> st.SearchStrategy[Any]:
    """A hostile scalar for the value of `key`: a hostile time for a key that holds one."""
    if key in TIME_KEYS:
        return st.sampled_from(HOSTILE_TIMES)
    return st.sampled_from([*HOSTILE_TEXT, *HOSTILE_NUMBERS])


def nested(value: Any, depth: int, kind: str) -> Any:
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def json_like(max_depth: int) -> st.SearchStrategy[Any]:
    """Random JSON-like structures of hostile leaves, some of them nested up to `max_depth` levels deep."""
    tree = st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
        max_leaves=16,
    )
    deep = st.builds(nested, scalars, st.integers(1, max_depth), st.sampled_from(["list", "dict"]))
    return tree | deep


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value in a document, the document itself first."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _slots(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _slots(item, (*path, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, documents: list[Any], max_depth: int) -> Any:
    """One of `documents` (each valid) with one to three of its values deleted, replaced by a hostile value
    or structure (a hostile time where a time goes), renamed (a key), wrapped in up to `max_depth` lists or
    mappings, or given as another type."""
    document = copy.deepcopy(draw(st.sampled_from(documents)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_slots(document)))
        how = draw(st.sampled_from(["delete", "replace", "rename", "wrap", "retype"]))
        if not path:
            document = draw(json_like(max_depth)) if how == "replace" else [document]
            continue
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        if how == "delete":
            del parent[key]
        elif how == "replace":
            parent[key] = draw(hostile_for(key) | json_like(max_depth))
        elif how == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(key)
        elif how == "wrap":
            parent[key] = nested(parent[key], draw(st.integers(1, max_depth)), draw(st.sampled_from(["list", "dict"])))
        else:
            value = parent[key]
            parent[key] = str(value) if not isinstance(value, str) else draw(st.sampled_from([1, 1.5, True, None, []]))
    return document


@st.composite
def as_text(draw: st.DrawFn, document: Any) -> str:
    """`document` written as JSON or YAML, sometimes cut short or with hostile text spliced in."""
    how = draw(st.sampled_from(["json", "json-ascii", "yaml-block", "yaml-flow"]))
    text: str | None = None
    if how.startswith("yaml"):
        try:
            text = yaml.safe_dump(document, default_flow_style=how == "yaml-flow", allow_unicode=True)
        except (yaml.YAMLError, ValueError, TypeError, RecursionError):
            text = None  # a value PyYAML does not write: as JSON instead
    if text is None:
        text = json.dumps(document, default=str, skipkeys=True, ensure_ascii=how == "json-ascii")
    edit = draw(st.sampled_from(["none", "none", "cut", "splice"]))
    if edit != "none" and text:
        at = draw(st.integers(0, len(text)))
        spliced = draw(st.sampled_from(HOSTILE_TEXT) | st.sampled_from(HOSTILE_YAML) | st.text())
        text = text[:at] if edit == "cut" else text[:at] + spliced + text[at:]
    return text


# YAML a job file, scenario or workload may hold: values PyYAML's constructors choke on, aliases, tags, merges,
# keys given twice or that are no scalar, directives
HOSTILE_YAML = ["2024-13-45", "2001-1-1 25:00:00", "!!int abc", "!!float ''", "!!bool maybe", "!!timestamp 1-1-1"]
HOSTILE_YAML += ["!!map [1]", "!!set [a]", "!!omap [1]", "!!binary '###'", '"\\U00110000"', '"\\ud800"', "*a"]
HOSTILE_YAML += ["&a [*a]", "!!python/name:os.system", "{<<: {a: 1}}", "{a: 1, a: 2}", "{? [a]: 1}", "0x_", "1:30"]
HOSTILE_YAML += ["010", ".inf", "-.nan", "~", "!!str", "|\n  text", ">-\n  folded", "'", '"', "[", "{", "!", "&", "%"]
hostile_yaml = st.lists(st.sampled_from(HOSTILE_YAML), min_size=1, max_size=3).map(
    lambda values: "".join(f"k{i}: {value}\n" for i, value in enumerate(values))
)

# Nested far past every limit (32 levels): as text, which no encoder could write from a structure
DEEP_TEXT = [("[", "]"), ('{"a": ', "}"), ("- ", ""), ("{a: ", "}"), ("[", ""), ("a:\n ", "")]
deep_text = st.builds(
    lambda pair, depth, inner: pair[0] * depth + inner + pair[1] * depth,
    st.sampled_from(DEEP_TEXT),
    st.integers(33, 5_000),
    st.sampled_from(["1", "x", "", "[]"]),
)
YAML_AND_JSON_CHARACTERS = list("{}[]:,-?&*!|>'\"#%@` \t\n0123456789.eE+xa")


def random_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=200),
        st.text(alphabet=st.sampled_from(YAML_AND_JSON_CHARACTERS), max_size=200),
        st.sampled_from(HOSTILE_TEXT),
        st.sampled_from(HOSTILE_YAML),
        hostile_yaml,
        deep_text,
    )


def as_bytes(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogatepass")  # an unpaired surrogate as bytes no UTF-8 decoder takes


def random_bytes() -> st.SearchStrategy[bytes]:
    prefixes = [b"\xef\xbb\xbf", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80", b"\x00", b"\x89PNG\r\n\x1a\n"]
    return st.binary(max_size=200) | st.tuples(st.sampled_from(prefixes), st.binary(max_size=50)).map(b"".join)


# --- the valid documents of events/: what the mutations start from ---------------------------------------------


@functools.cache
def job_documents(events_dir: Path) -> list[Any]:
    resnet50 = yaml.safe_load((events_dir / "jobs" / "resnet50.yaml").read_text())
    minimal = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}
    return [resnet50, minimal]


@functools.cache
def recorded_events(events_dir: Path) -> list[Any]:
    """Every recorded event: interruption warnings, a rebalance recommendation, state changes, the queue-depth
    alarm, and a malformed warning."""
    return [json.loads(path.read_text()) for path in sorted((events_dir / "recorded").glob("*.json"))]


@functools.cache
def scenario_documents(events_dir: Path) -> list[Any]:
    return [yaml.safe_load(path.read_text()) for path in sorted((events_dir / "scenarios").glob("*.yaml"))]


WORKLOAD_DOCUMENTS: list[Any] = [
    {
        "name": "nightly",
        "instance_types": ["p3.2xlarge"],
        "spot_price_usd_per_hour": 0.97,
        "on_demand_usd_per_hour": {"p3.2xlarge": 3.06},
        "jobs": [
            {
                "name": "train-a",
                "resources": {"gpus": 1},
                "work_hours": 6,
                "limits": {"deadline_hours": 9, "max_price_per_hour": 1.5},
                "recovery": "same-pool-first",
                "submit": "2h",
                "restart_overhead": "6m",
                "checkpoint_on_notice": False,
                "per_zone": True,
                "repeat": {"count": 3, "every": "24h"},
            }
        ],
    },
    {"jobs": [{"name": "b", "resources": {"gpus": 1}, "work_hours": 2, "limits": {"deadline_hours": 4}}]},
]


def written(directory: Path, name: str, content: str | bytes) -> Path:
    path = directory / name
    path.write_bytes(as_bytes(content) if isinstance(content, str) else content)
    return path


# --- the job spec ---------------------------------------------------------------------------------------------


def assert_clear(error: JobSpecError) -> None:
    """What every JobSpecError promises: one line, each of its problems bounded."""
    assert "\n" not in str(error)
    assert error.problems
    assert all(len(problem) <= MAX_PROBLEM_CHARS for problem in error.problems)


def read_job_text(text: str) -> JobSpec:
    return parse_job_spec(decode_document(text, "job.yaml"), "job.yaml")


@fuzzed(55)
@given(data=st.data())
def test_a_job_spec_text_is_a_spec_or_a_job_spec_error(events_dir: Path, data: st.DataObject) -> None:
    # Given any text: random, nested deep, or a valid job spec mutated and written as YAML or JSON
    text = data.draw(random_text() | mutated(job_documents(events_dir), 100).flatmap(as_text))
    # When it is read as `spotrelay submit` reads a job file
    outcome = within_bounds(lambda: read_job_text(text), JobSpecError)
    # Then it is a spec, or refused with a clear JobSpecError
    assert isinstance(outcome, JobSpec | JobSpecError)
    if isinstance(outcome, JobSpecError):
        assert_clear(outcome)


@fuzzed(30)
@given(data=st.data())
def test_a_job_file_of_any_bytes_is_a_spec_or_a_job_spec_error(
    events_dir: Path, tmp_path: Path, data: st.DataObject
) -> None:
    # Given a job file of any bytes: random, or a mutated spec's text with bytes no UTF-8 reader takes
    content = data.draw(random_bytes() | mutated(job_documents(events_dir), 100).flatmap(as_text).map(as_bytes))
    path = written(tmp_path, "job.yaml", content)
    # When it is loaded (read_document, document_text, decode_document, parse_job_spec), or only decoded
    loaded = within_bounds(lambda: load_job_spec(path), JobSpecError)
    decoded = within_bounds(lambda: document_text(content, "job.yaml"), JobSpecError)
    # Then it is a spec, or a clear JobSpecError; and its bytes are text or a JobSpecError
    assert isinstance(loaded, JobSpec | JobSpecError)
    if isinstance(loaded, JobSpecError):
        assert_clear(loaded)
    assert isinstance(decoded, str | JobSpecError)


@fuzzed(45)
@given(data=st.data())
def test_a_decoded_job_spec_of_any_shape_is_a_spec_or_a_job_spec_error(events_dir: Path, data: st.DataObject) -> None:
    # Given any decoded document: a random structure, or a valid spec mutated
    document = data.draw(json_like(300) | mutated(job_documents(events_dir), 300))
    # When it is validated
    outcome = within_bounds(lambda: parse_job_spec(document, "job spec"), JobSpecError)
    # Then it is a spec, or a clear JobSpecError
    assert isinstance(outcome, JobSpec | JobSpecError)
    if isinstance(outcome, JobSpecError):
        assert_clear(outcome)


@fuzzed(30)
@given(data=st.data())
def test_json_of_any_text_is_a_value_or_a_job_spec_error(events_dir: Path, data: st.DataObject) -> None:
    # Given any text, most of it JSON of random or mutated structures
    text = data.draw(
        random_text() | json_like(100).flatmap(as_text) | mutated(job_documents(events_dir), 100).flatmap(as_text)
    )
    # When it is decoded as JSON within a job spec's limits (decode_json)
    outcome = within_bounds(lambda: decode_json(text, "message"), JobSpecError)
    # Then it is a value, or a clear JobSpecError
    if isinstance(outcome, JobSpecError):
        assert_clear(outcome)


# --- the dispatcher's reading of a queue message -------------------------------------------------------------


@fuzzed(50)
@given(data=st.data())
def test_a_queue_message_is_a_spec_or_a_short_printable_refusal(events_dir: Path, data: st.DataObject) -> None:
    # Given a message of any body (random text, JSON of random structures, a mutated spec as senders write it)
    body = data.draw(
        random_text() | json_like(100).flatmap(as_text) | mutated(job_documents(events_dir), 100).flatmap(as_text)
    )
    submission_id = data.draw(st.none() | st.uuids().map(str) | st.text(max_size=40))
    message = QueueMessage(message_id="msg-1", receipt_handle="r-1", body=body, submission_id=submission_id)
    # When the dispatcher reads it
    outcome = within_bounds(lambda: read_submission(message))
    # Then it is a spec, or a refusal with a short printable reason, refused by a bound or a rule (not by the
    # catch-all for a body no bound foresaw)
    assert isinstance(outcome, JobSpec | Refusal)
    if isinstance(outcome, Refusal):
        assert len(outcome.reason) <= MAX_REASON_CHARS
        assert printable(outcome.reason) == outcome.reason
        assert not outcome.reason.startswith("message msg-1: cannot be read as a job spec ("), outcome.reason


# --- EC2 and alarm events, through the ec2-events function -----------------------------------------------------


@dataclass(frozen=True)
class LambdaContextStub:
    """The part of the Lambda context Powertools reads."""

    function_name: str = "spotrelay-ec2-events"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:spotrelay-ec2-events"
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"


@pytest.fixture(scope="module")
def ec2_events_function() -> Iterator[ModuleType]:
    """functions/ec2_events.py as a cold start imports it, with its settings' environment (its boto3 clients
    are made and never called: each input replaces its ports with fakes), quiet; put back after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # `functions/` is no installed package
        environment = {
            ENV_TABLE: "spotrelay-jobs",
            ENV_STATE_MACHINE_ARN: "arn:aws:states:us-east-1:123456789012:stateMachine:JobLifecycle",
            ENV_BLOCK_MINUTES: "30",
            "AWS_DEFAULT_REGION": "us-east-1",
            "POWERTOOLS_SERVICE_NAME": "spotrelay",
            "POWERTOOLS_METRICS_NAMESPACE": "spotrelay",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": "CRITICAL",
        }
        for key, value in environment.items():
            patch.setenv(key, value)
        patch.setitem(sys.modules, "functions.ec2_events", None)  # remembers what to put back
        del sys.modules["functions.ec2_events"]
        yield importlib.import_module("functions.ec2_events")


@st.composite
def one_field_hostile(draw: st.DrawFn, events: list[Any]) -> Any:
    """One of `events` with one of the fields the function reads (envelope or detail) made hostile; most often
    the time, which the function reckons with (the others it matches)."""
    event = copy.deepcopy(draw(st.sampled_from(events)))
    key = draw(
        st.sampled_from(["time", "time", "time", "id", "source", "detail-type", "detail", "instance-id", "state"])
    )
    where = event["detail"] if key in {"instance-id", "state"} and isinstance(event["detail"], dict) else event
    where[key] = draw(hostile_for(key))
    return event


def handled(function: ModuleType, world: World, event: Any) -> Any:
    """What the ec2-events function answers to `event`, its ports the fakes of `world`, as Lambda calls it."""
    with pytest.MonkeyPatch.context() as patch:
        for port in ("store", "workflow", "compute"):
            if hasattr(function, port):  # (compute: the bill an ended instance settles)
                patch.setattr(function, port, getattr(world, port))
        return function.handler(event, LambdaContextStub())


EVENT_ACTIONS = {"malformed", "ignore", "interrupt", "rebalance", "running", "lost", "handover", "standby-lost"}


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
@fuzzed(40)
@given(data=st.data())
def test_an_ec2_or_alarm_event_is_handled_or_acknowledged_as_malformed(
    ec2_events_function: ModuleType, events_dir: Path, data: st.DataObject
) -> None:
    # Given a job running on its instance, and an event: a recorded one (interruption warnings, a rebalance
    # recommendation, state changes, the queue-depth alarm) about that instance, mutated; or any structure
    world = World()
    instance_id = world.running().instance_id
    events = copy.deepcopy(recorded_events(events_dir))
    for recorded in events:
        if "instance-id" in recorded["detail"]:
            recorded["detail"]["instance-id"] = instance_id
    event = data.draw(
        st.one_of(one_field_hostile(events), one_field_hostile(events), mutated(events, 50), json_like(50))
    )
    # When the ec2-events function handles it, as Lambda calls it (the envelope, the detail, the action)
    outcome = within_bounds(lambda: handled(ec2_events_function, world, event))
    # Then it answers: what it did, or the event acknowledged as malformed with a short reason; never raised
    assert isinstance(outcome, dict)
    assert outcome["action"] in EVENT_ACTIONS
    if outcome["action"] == "malformed":
        assert len(outcome["reason"]) <= ec2_events_function.MAX_REASON_CHARS


# --- scenarios and their event files ----------------------------------------------------------------------------


def read_scenario(document: Any, base_dir: Path) -> tuple[Scenario, int, int]:
    """A scenario as the replay reads it before its deploy: the document, its job messages, its events."""
    scenario = parse_scenario(document, base_dir, "scenario.yaml")
    return scenario, len(submissions(scenario)), len(injections(scenario))


@fuzzed(35)
@given(data=st.data())
def test_a_decoded_scenario_is_a_scenario_or_a_scenario_error(events_dir: Path, data: st.DataObject) -> None:
    # Given a scenario of events/scenarios mutated (its job and event files read from there), or any structure,
    # nested as deep as a scenario file may be (SCENARIO_LIMITS: 32)
    document = data.draw(mutated(scenario_documents(events_dir), 10) | json_like(30))
    # When it is parsed, and its messages and events read, Then it is a scenario, or a ScenarioError
    outcome = within_bounds(lambda: read_scenario(document, events_dir / "scenarios"), ScenarioError)
    assert isinstance(outcome, tuple | ScenarioError)


@fuzzed(18)
@given(data=st.data())
def test_a_scenario_file_of_any_text_is_a_scenario_or_a_scenario_error(
    events_dir: Path, tmp_path: Path, data: st.DataObject
) -> None:
    # Given a scenario file: random text or bytes, or a mutated scenario written as YAML or JSON
    content = data.draw(random_text() | random_bytes() | mutated(scenario_documents(events_dir), 100).flatmap(as_text))
    path = written(tmp_path, "scenario.yaml", content)

    def read() -> tuple[Scenario, int, int]:
        scenario = load_scenario(path)
        return scenario, len(submissions(scenario)), len(injections(scenario))

    # When it is loaded, Then it is a scenario or a ScenarioError
    assert isinstance(within_bounds(read, ScenarioError), tuple | ScenarioError)


@fuzzed(30)
@given(data=st.data())
def test_an_events_file_of_any_lines_is_injections_or_a_scenario_error(
    events_dir: Path, tmp_path: Path, data: st.DataObject
) -> None:
    # Given an events file (`spotrelay events export`'s .jsonl, or one event's .json) of recorded events
    # mutated (with or without their `spotrelay` annotation), random JSON, or random text
    annotated = [{**e, "spotrelay": {"job": "resnet50", "attempt": 1}} for e in recorded_events(events_dir)]
    event = mutated([*recorded_events(events_dir), *annotated], 50)
    line = event.map(lambda e: json.dumps(e, default=str)) | json_like(100).flatmap(as_text) | random_text()
    lines = data.draw(st.lists(line, min_size=1, max_size=4))
    name = data.draw(st.sampled_from(["events.jsonl", "event.json"]))
    written(tmp_path, name, "\n".join(lines))
    document = {"name": "fuzz", "start": "2026-11-30T00:00:00Z", "events": [{"file": name}]}
    # When its events are read, Then they are injections, or a ScenarioError
    outcome = within_bounds(lambda: injections(parse_scenario(document, tmp_path)), ScenarioError)
    assert isinstance(outcome, list | ScenarioError)


# --- workload files --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_inputs(tmp_path_factory: pytest.TempPathFactory) -> BenchInputs:
    """Always-available p3.2xlarge traces (label v100_1) of 100 one-hour ticks, in two zones."""
    directory = tmp_path_factory.mktemp("traces")
    trace = json.dumps({"metadata": {"gap_seconds": 3600}, "data": [1] * 100})
    for zone in ("us-east-1a", "us-west-2a"):
        (directory / f"{zone}_v100_1.json").write_text(trace)
    return load_inputs([directory])


@fuzzed(20)
@given(data=st.data())
def test_a_workload_file_is_a_workload_or_a_workload_error(
    bench_inputs: BenchInputs, tmp_path: Path, data: st.DataObject
) -> None:
    # Given a workload file: random text or bytes, or a valid workload mutated and written as YAML or JSON
    content = data.draw(random_text() | random_bytes() | mutated(WORKLOAD_DOCUMENTS, 100).flatmap(as_text))
    path = written(tmp_path, "workload.yaml", content)
    # When the bench builds it, Then it is a workload, or a WorkloadError
    outcome = within_bounds(lambda: load_workload_file(path, bench_inputs), WorkloadError)
    assert isinstance(outcome, Workload | WorkloadError)


def test_the_documents_the_mutations_start_from_are_valid(
    events_dir: Path, bench_inputs: BenchInputs, tmp_path: Path
) -> None:
    # Given the documents the properties mutate; When each is read as it is; Then each is valid, so that a
    # mutation starts from an input that gets past every check, and every kind of event is among them
    for document in job_documents(events_dir):
        parse_job_spec(document)
    for document in scenario_documents(events_dir):
        read_scenario(document, events_dir / "scenarios")
    for document in WORKLOAD_DOCUMENTS:
        load_workload_file(written(tmp_path, "workload.json", json.dumps(document)), bench_inputs)
    assert {e["detail-type"] for e in recorded_events(events_dir)} >= {
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "CloudWatch Alarm State Change",
    }


# --- regressions: what the fuzzing found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("deadline: 2024-13-45\n", "line 1: '2024-13-45' reads as a YAML timestamp, and is not a valid one (month"),
        ("a: 1\nwhen: 2001-1-1 25:00:00\n", "line 2: '2001-1-1 25:00:00' reads as a YAML timestamp"),
        ("gpus: !!int abc\n", "line 1: 'abc' reads as a YAML int, and is not a valid one"),
        ("gpus: !!float ''\n", "line 1: '' reads as a YAML float, and is not a valid one"),
        ("on: !!bool maybe\n", "line 1: 'maybe' reads as a YAML bool, and is not a valid one"),
        ("at: !!timestamp 1-1-1\n", "line 1: '1-1-1' reads as a YAML timestamp, and is not a valid one"),
        ("!!map [1]\n", "line 1: not valid YAML or JSON (expected a mapping node, but found sequence)"),
        ("tags: !!set [a]\n", "line 1: not valid YAML or JSON (expected a mapping node, but found sequence)"),
        ('name: "\\U00110000"\n', "line 1: not valid YAML or JSON (an escape past U+10FFFF"),
    ],
)
def test_a_yaml_value_pyyaml_cannot_construct_is_a_job_spec_error_naming_the_line(text: str, problem: str) -> None:
    # Given YAML whose value its (implicit or explicit) tag cannot hold: PyYAML raised ValueError, TypeError,
    # KeyError, IndexError or AttributeError, a traceback for `spotrelay submit` and the replay
    # When it is decoded
    with pytest.raises(JobSpecError) as refused:
        decode_document(text, "job.yaml")
    # Then it is a JobSpecError naming the line, and saying what to do with text
    assert refused.value.problems[0].startswith(problem), refused.value.problems
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["job\x00.yaml", "job\ud800.yaml"])
def test_a_file_name_no_file_can_have_is_a_job_spec_error(tmp_path: Path, name: str) -> None:
    # Given a path with a NUL or an unpaired surrogate in it (os.stat raised ValueError)
    # When it is loaded as a job file, Then it is a JobSpecError saying it cannot be read
    with pytest.raises(JobSpecError, match="cannot read: "):
        load_job_spec(tmp_path / name)


SCENARIO = {"name": "fuzz", "start": "2026-11-30T00:00:00Z"}


def test_a_job_file_name_with_a_nul_in_a_scenario_is_a_scenario_error(tmp_path: Path) -> None:
    # Given a scenario whose job names its spec file with a NUL in it
    scenario = parse_scenario({**SCENARIO, "jobs": [{"spec": {"file": "job\x00.yaml"}}]}, tmp_path)
    # When its messages are made, Then it is a ScenarioError naming the field
    with pytest.raises(ScenarioError, match=r"^jobs\[0\]\.spec\.file: .*cannot read: "):
        submissions(scenario)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"name": "a", "run": {"command": "x", 1: "y"}, "resources": {"gpus": 1}}, "not supported between"),
        ({"name": "a", "run": {"command": "x"}, "resources": {"gpus": 1}, "x": date(2024, 1, 1)}, "date is not JSON"),
    ],
)
def test_an_inline_spec_no_json_message_can_carry_is_a_scenario_error(
    tmp_path: Path, spec: dict[str, Any], problem: str
) -> None:
    # Given an inline job spec holding a YAML date, or a mapping with a number beside a text key (json.dumps
    # raised TypeError)
    scenario = parse_scenario({**SCENARIO, "jobs": [{"spec": spec}]}, tmp_path)
    # When its message is made, Then it is a ScenarioError naming the job's spec
    with pytest.raises(ScenarioError, match=rf"^jobs\[0\]\.spec: cannot be sent as a queue message \(.*{problem}"):
        submissions(scenario)


@pytest.mark.parametrize(
    "scenario",
    [
        {**SCENARIO, "horizon": 1e300},
        {**SCENARIO, "jobs": [{"at": 1e300, "body": "{}"}]},
        {**SCENARIO, "events": [{"at": "99999999999h", "file": "e.json"}]},
        {**SCENARIO, "start": "9999-12-31T23:00:00Z"},  # the default 48 h horizon ends past 9999
    ],
)
def test_a_time_past_the_calendar_is_a_scenario_error_naming_the_field(tmp_path: Path, scenario: Any) -> None:
    # Given a scenario whose horizon, or a job's or event's `at`, lands past 9999-12-31 (submissions, injections
    # and the replay raised OverflowError)
    # When it is parsed, Then it is a ScenarioError naming the field
    with pytest.raises(ScenarioError, match=r"(horizon|jobs\[0\]\.at|events\[0\]\.at): .* past the last date"):
        parse_scenario(scenario, tmp_path)


EVENT = {"source": "aws.ec2", "detail-type": "EC2 Instance Rebalance Recommendation", "detail": {}}


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (["5"], r"events\.jsonl:1 is not an event \(a JSON object\)"),
        ([json.dumps(EVENT), "[1]"], r"events\.jsonl:2 is not an event \(a JSON object\)"),
        ([json.dumps({**EVENT, "spotrelay": 5})], r"events\.jsonl:1: spotrelay: the annotation is \{job: name"),
        ([json.dumps({**EVENT, "spotrelay": "resnet50"})], r"spotrelay: the annotation is .*not str"),
        (['{"source": ' + "9" * 5000 + "}"], r"events\.jsonl:1: a number of 5000 digits"),
        (
            [
                json.dumps({**EVENT, "time": "0001-01-01T00:00:00Z"}),
                json.dumps({**EVENT, "time": "9999-12-31T00:00:00Z"}),
            ],
            r"events\.jsonl:2: time 9999-12-31T00:00:00Z is too far from the file's first event",
        ),
    ],
)
def test_an_events_file_line_that_is_no_event_is_a_scenario_error(
    tmp_path: Path, lines: list[str], problem: str
) -> None:
    # Given an events file with a line of JSON that is no object, an annotation that is no object, an integer of
    # 5,000 digits, or times further apart than the calendar reaches (AttributeError, ValueError, OverflowError)
    written(tmp_path, "events.jsonl", "\n".join(lines))
    scenario = parse_scenario({**SCENARIO, "events": [{"file": "events.jsonl"}]}, tmp_path)
    # When its events are read, Then it is a ScenarioError naming the entry, the file and the line
    with pytest.raises(ScenarioError, match=rf"^events\[0\]\.file: .*{problem}"):
        injections(scenario)


def test_an_event_file_with_an_integer_of_5000_digits_is_a_scenario_error(tmp_path: Path) -> None:
    # Given one event's .json file holding an integer of 5,000 digits (json.loads raised ValueError)
    written(tmp_path, "event.json", '{"source": "aws.ec2", "detail-type": "x", "detail": {"n": ' + "9" * 5000 + "}}")
    scenario = parse_scenario({**SCENARIO, "events": [{"file": "event.json"}]}, tmp_path)
    # When it is read, Then it is a ScenarioError naming the entry and the number
    with pytest.raises(ScenarioError, match=r"^events\[0\]\.file: .*event\.json: a number of 5000 digits"):
        injections(scenario)


def test_a_workload_file_that_is_not_utf8_is_a_workload_error(tmp_path: Path, bench_inputs: BenchInputs) -> None:
    # Given a workload file of bytes that are no UTF-8 (Path.read_text raised UnicodeDecodeError)
    path = written(tmp_path, "workload.yaml", b"jobs: [\xff]\n")
    # When the bench builds it, Then it is a WorkloadError naming the file and saying what a workload is
    with pytest.raises(WorkloadError, match=r"workload\.yaml: not UTF-8 text \(byte 0xff at 7\): a workload is YAML"):
        load_workload_file(path, bench_inputs)


def test_a_fault_whose_kind_is_a_list_is_a_scenario_error(tmp_path: Path) -> None:
    # Given a scenario with a fault whose kind is a list; When it is parsed; Then it is a ScenarioError
    with pytest.raises(ScenarioError, match="kind"):
        parse_scenario({**SCENARIO, "faults": [{"job": "a", "kind": ["agent-dies"]}]}, tmp_path)


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
@pytest.mark.parametrize("name", ["spot-interruption-warning.json", "instance-state-change-stopping.json"])
def test_an_ec2_event_timed_at_the_end_of_the_calendar_is_acknowledged_as_malformed(
    ec2_events_function: ModuleType, events_dir: Path, name: str
) -> None:
    # Given a job running on its instance, and a warning (or state change) for it timed 9999-12-31T23:59:59Z:
    # blocking the pool until 30 minutes later raised OverflowError, after the attempt was marked interrupted
    world = World()
    attempt = world.running()
    event = json.loads((events_dir / "recorded" / name).read_text())
    event["detail"]["instance-id"] = attempt.instance_id
    event["time"] = "9999-12-31T23:59:59Z"
    # When the ec2-events function handles it
    outcome = handled(ec2_events_function, world, event)
    # Then it is acknowledged as malformed, naming the time and what is allowed; the attempt is untouched
    assert outcome["action"] == "malformed"
    assert outcome["reason"] == "time: Input should be less than 9000-01-01T00:00:00Z (got 9999-12-31T23:59:59+00:00)"
    assert world.attempt() == attempt
