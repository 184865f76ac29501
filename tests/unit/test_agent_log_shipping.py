"""The agent's CloudWatch shipping while CloudWatch Logs does not take lines: memory stays bounded, the
journal keeps every line, and the stream says how many it lacks once lines flow again.

Nothing here waits on real time: the tests wait on the fakes' events and on watchtower's queue, and every
line is stamped by the test, a millisecond after the one before (CloudWatch Logs, and watchtower within a
batch, order lines by that stamp), so the order in the stream never depends on when a line was made."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

import spotrelay.agent.logs
from spotrelay.agent.logs import (
    AGENT_DONE,
    UNSHIPPED,
    EarlyLines,
    JobLogger,
    JsonLineFormatter,
    ship_to_cloudwatch,
)


class StalledLogs:
    """CloudWatch Logs whose PutLogEvents hangs until `recover` is set, then takes everything."""

    class exceptions:  # boto3 client attribute
        class ResourceAlreadyExistsException(Exception):
            pass

    def __init__(self) -> None:
        self.recover = threading.Event()
        self.calls = threading.Semaphore(0)
        self.shipped: list[dict[str, Any]] = []

    def create_log_stream(self, **kwargs: Any) -> dict[str, Any]:
        return {}

    def release(self) -> None:
        self.recover.set()

    def put_log_events(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.release()
        self.recover.wait(timeout=60)  # a guard against a hang only: every test sets it
        self.shipped.extend(json.loads(event["message"]) for event in kwargs["logEvents"])
        return {"nextSequenceToken": "t"}


class OneLinePerMillisecond(logging.Filter):
    """Stamps each line 1 ms after the previous one (from 2026-11-30T12:00:00Z): lines made within the same
    real millisecond stay in the order they were logged, and a line made by the handler itself (the count of
    the lines left out) must take its stamp from the line it comes with, or it lands a millisecond off."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.lines += 1
        record.created = 1_796_040_000 + self.lines / 1000
        record.msecs = float(self.lines % 1000)
        return True


@contextmanager
def shipping(client: Any, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Iterator[tuple[JobLogger, Any]]:
    """Attempt 1 of job-1 logging through `ship_to_cloudwatch` to `client`, batches every 50 ms, each line
    stamped by `OneLinePerMillisecond`; at the end of the block the client is released (a test that failed
    halfway does not leave watchtower's sender hanging), the handler closed (what is left is sent) and detached."""
    monkeypatch.setattr(spotrelay.agent.logs, "SHIP_INTERVAL_SECONDS", 0.05)
    logger = logging.getLogger(f"test.agent.shipping.{id(client)}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    stamps = OneLinePerMillisecond()
    logger.addFilter(stamps)
    handler = ship_to_cloudwatch(client, "/spotrelay/SpotRelay/agent", "job-1/00001", logger, **options)
    try:
        yield JobLogger("job-1", 1, logger), handler
    finally:
        client.release()
        handler.close()
        logger.removeHandler(handler)
        logger.removeFilter(stamps)


def test_lines_beyond_the_bound_are_left_to_the_journal_and_the_stream_says_how_many(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = StalledLogs()
    with shipping(client, monkeypatch, max_queued=100) as (log, handler):
        # Given a batch in flight that CloudWatch does not answer
        log.info("job output", extra={"line": "first"})
        assert client.calls.acquire(timeout=30), "watchtower never sent its first batch"

        # When the job prints 250 more lines meanwhile
        for n in range(250):
            log.info("job output", extra={"line": f"stalled {n}"})

        # Then 100 wait, the other 150 are left to the journal, which is told once
        queued = getattr(handler, "queues")["job-1/00001"]  # noqa: B009 - watchtower's, untyped
        assert queued.qsize() == 100
        [warning] = capsys.readouterr().err.splitlines()
        assert json.loads(warning)["message"] == "log lines not shipped: CloudWatch Logs is not taking them"

        # And once CloudWatch takes lines again, the next line comes after a count of what is missing
        client.recover.set()
        queued.join()  # watchtower's thread has taken the 100 into its next batch
        log.info("job output", extra={"line": "after"})
    lines = [event.get("line") for event in client.shipped]
    assert lines == ["first", *(f"stalled {n}" for n in range(100)), None, "after"]
    note, after = client.shipped[-2:]
    assert note["message"] == UNSHIPPED
    assert note["lines"] == 150
    assert (note["job_id"], note["attempt"]) == ("job-1", 1)
    assert note["time"] == after["time"]  # stamped with the line it comes with, so it sorts right before it


@pytest.mark.parametrize("agent_says_done", [True, False])
def test_the_agents_last_lines_pass_the_bound_and_the_count_of_the_rest_is_never_lost(
    monkeypatch: pytest.MonkeyPatch, agent_says_done: bool
) -> None:
    client = StalledLogs()
    with shipping(client, monkeypatch, max_queued=100) as (log, _):
        # Given CloudWatch not answering while the job prints its last 150 lines (50 over the bound)
        log.info("job output", extra={"line": "first"})
        assert client.calls.acquire(timeout=30), "watchtower never sent its first batch"
        for n in range(150):
            log.info("job output", extra={"line": f"stalled {n}"})
        # When the agent ends (with a warning and its last line, or killed before it says anything), and
        # CloudWatch answers again as the handler closes
        if agent_says_done:
            log.warning("final checkpoint slow", extra={"seconds": 90})
            log.info(AGENT_DONE, extra={"outcome": "succeeded"})
        client.recover.set()
    # Then the warning and the last line get through the bound, and the count of the 50 lines left out is
    # shipped either way: before the first line that gets through, or at close
    messages = [event["message"] for event in client.shipped]
    if agent_says_done:
        assert messages[-3:] == [UNSHIPPED, "final checkpoint slow", AGENT_DONE]
    else:
        assert messages[-1] == UNSHIPPED
    [note] = [event for event in client.shipped if event["message"] == UNSHIPPED]
    assert note["lines"] == 50
    assert (note["job_id"], note["attempt"]) == ("job-1", 1)


class LostStreamLogs:
    """CloudWatch Logs whose stream is not there at first (the agent could not create it at boot): the first
    PutLogEvents says so, and the CreateLogStream that watchtower's sender then makes takes until `created`."""

    class exceptions:  # boto3 client attribute
        class ResourceAlreadyExistsException(ClientError):
            pass

        class ResourceNotFoundException(ClientError):
            pass

        class DataAlreadyAcceptedException(ClientError):
            pass

        class InvalidSequenceTokenException(ClientError):
            pass

    def __init__(self) -> None:
        self.creating = threading.Event()
        self.created = threading.Event()
        self.exists = False
        self.boot_attempts = 0
        self.shipped: list[dict[str, Any]] = []

    def release(self) -> None:
        self.created.set()

    def create_log_stream(self, **kwargs: Any) -> dict[str, Any]:
        if self.boot_attempts == 0:  # the agent's own attempt at boot fails (the network is not up)
            self.boot_attempts += 1
            raise OSError("network unreachable")
        self.creating.set()
        self.created.wait(timeout=30)  # a guard against a hang only: every test sets it
        self.exists = True
        return {}

    def put_log_events(self, **kwargs: Any) -> dict[str, Any]:
        if not self.exists:
            error: Any = {"Error": {"Code": "ResourceNotFoundException", "Message": "no stream"}}
            raise self.exceptions.ResourceNotFoundException(error, "PutLogEvents")
        self.shipped.extend(json.loads(event["message"]) for event in kwargs["logEvents"])
        return {"nextSequenceToken": "t"}


def test_lines_logged_while_watchtower_recreates_the_stream_are_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    client = LostStreamLogs()
    with shipping(client, monkeypatch) as (log, _):
        # Given a first line whose send finds no stream, so watchtower's sender recreates it
        log.info("job output", extra={"line": "first"})
        assert client.creating.wait(timeout=30), "watchtower never recreated the stream"
        # When the job prints while the stream is being created
        for n in range(20):
            log.info("job output", extra={"line": f"during {n}"})
        client.created.set()
    # Then every line arrives, in order
    assert [event.get("line") for event in client.shipped] == ["first", *(f"during {n}" for n in range(20))]


def network_down() -> Exception:
    return EndpointConnectionError(endpoint_url="https://logs.us-east-1.amazonaws.com/")


def service_unavailable() -> Exception:
    return ClientError({"Error": {"Code": "ServiceUnavailableException", "Message": "try later"}}, "PutLogEvents")


class FailingLogs:
    """CloudWatch Logs that fails every PutLogEvents (each of watchtower's tries of a batch) while `down` is set,
    and every one carrying a line of `refused` (the job output lines given); takes the rest."""

    class exceptions(LostStreamLogs.exceptions):  # boto3 client attribute
        class OperationAbortedException(ClientError):
            pass

    def __init__(self, error: Callable[[], Exception]) -> None:
        self.error = error
        self.down = threading.Event()
        self.refused: set[str] = set()
        self.failed = 0
        self.shipped: list[dict[str, Any]] = []

    def create_log_stream(self, **kwargs: Any) -> dict[str, Any]:
        return {}

    def release(self) -> None:
        self.down.clear()

    def put_log_events(self, **kwargs: Any) -> dict[str, Any]:
        events = [json.loads(event["message"]) for event in kwargs["logEvents"]]
        if self.down.is_set() or any(event.get("line") in self.refused for event in events):
            self.failed += 1
            raise self.error()
        self.shipped.extend(events)
        return {"nextSequenceToken": "t"}


@pytest.mark.filterwarnings("ignore:Failed to deliver logs")
@pytest.mark.parametrize("error", [network_down, service_unavailable])
def test_a_batch_watchtower_gives_up_on_is_counted_and_the_stream_says_so_once_sends_succeed(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], Exception]
) -> None:
    client = FailingLogs(error)
    with shipping(client, monkeypatch) as (log, handler):
        # Given CloudWatch Logs failing every PutLogEvents while the job prints 3 lines
        client.down.set()
        for n in range(3):
            log.info("job output", extra={"line": f"lost {n}"})
        handler.flush()  # watchtower's sender has tried their batch, every time it would, and given up on it
        assert client.failed >= 5
        assert client.shipped == []

        # When CloudWatch Logs takes lines again, and the job prints another
        client.down.clear()
        log.info("job output", extra={"line": "after"})
    # Then that line comes after a count of the 3 lost
    assert [event.get("line") for event in client.shipped] == [None, "after"]
    note, after = client.shipped
    assert note["message"] == UNSHIPPED
    assert note["lines"] == 3
    assert (note["job_id"], note["attempt"]) == ("job-1", 1)
    assert note["time"] == after["time"]  # stamped with the line it comes with, so it sorts right before it


@pytest.mark.filterwarnings("ignore:Failed to deliver logs")
def test_a_batch_lost_last_is_counted_in_a_note_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FailingLogs(network_down)
    with shipping(client, monkeypatch) as (log, handler):
        journal = EarlyLines()  # the lines as the journal has them
        log.logger.addHandler(journal)
        log.info("job output", extra={"line": "first"})
        handler.flush()
        # Given the job's last lines, whose batch CloudWatch Logs fails every time watchtower sends it
        client.refused = {f"last {n}" for n in range(3)}
        for n in range(3):
            log.info("job output", extra={"line": f"last {n}"})
        # When the agent closes the handler right away (while the batch may not have been sent yet), and
        # CloudWatch Logs takes what comes after it
    # Then the stream ends with a count of the 3, stamped with the last of them
    assert [event.get("line") for event in client.shipped] == ["first", None]
    note = client.shipped[-1]
    assert note["message"] == UNSHIPPED
    assert note["lines"] == 3
    assert (note["job_id"], note["attempt"]) == ("job-1", 1)
    assert note["time"] == json.loads(JsonLineFormatter().format(journal.lines[-1]))["time"]


@pytest.mark.filterwarnings("ignore:Failed to deliver logs")
def test_a_count_lost_with_its_batch_is_counted_again_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FailingLogs(service_unavailable)
    with shipping(client, monkeypatch) as (log, handler):
        # Given a batch of 3 lines lost while CloudWatch Logs fails every PutLogEvents
        client.down.set()
        for n in range(3):
            log.info("job output", extra={"line": f"lost {n}"})
        handler.flush()
        # When the next line goes with a count of them, in a batch lost too
        log.info("job output", extra={"line": "lost 3"})
        handler.flush()
        failed = client.failed
        handler.flush()  # nothing left to send: the lost count is not sent again on its own
        assert client.failed == failed
        # And CloudWatch Logs takes lines again
        client.down.clear()
        log.info("job output", extra={"line": "after"})
    # Then the one count the stream gets covers all 4 lines lost
    assert [event.get("line") for event in client.shipped] == [None, "after"]
    assert client.shipped[0]["message"] == UNSHIPPED
    assert client.shipped[0]["lines"] == 4


class UnreachableStreamLogs(LostStreamLogs):
    """LostStreamLogs (its stream not there at first), whose first CreateLogStream from watchtower's sender
    fails on the network (not a ClientError); the next one makes it."""

    class exceptions(LostStreamLogs.exceptions):  # boto3 client attribute
        class OperationAbortedException(ClientError):
            pass

    def __init__(self) -> None:
        super().__init__()
        self.created.set()
        self.unreachable = True

    def create_log_stream(self, **kwargs: Any) -> dict[str, Any]:
        if self.boot_attempts and self.unreachable:
            self.unreachable = False
            raise network_down()
        return super().create_log_stream(**kwargs)


@pytest.mark.filterwarnings("ignore:Failed to deliver logs")
def test_a_batch_lost_to_an_error_watchtower_lets_out_is_counted_and_shipping_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = UnreachableStreamLogs()
    with shipping(client, monkeypatch) as (log, handler):
        # Given a batch whose send finds no stream, and whose CreateLogStream then fails on the network
        for n in range(3):
            log.info("job output", extra={"line": f"lost {n}"})
        handler.flush()
        # When the job prints another line
        log.info("job output", extra={"line": "after"})
    # Then watchtower's sender is still there to send it (the stream made this time), after a count of the 3
    assert [event.get("line") for event in client.shipped] == [None, "after"]
    assert client.shipped[0]["message"] == UNSHIPPED
    assert client.shipped[0]["lines"] == 3


class WriteOnlyLogs(StalledLogs):
    """CloudWatch Logs as the job's credentials see it: they may write to their stream, not create one."""

    def __init__(self) -> None:
        super().__init__()
        self.recover.set()
        self.created: list[str] = []

    def create_log_stream(self, **kwargs: Any) -> dict[str, Any]:
        self.created.append(kwargs["logStreamName"])
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "CreateLogStream")


def test_lines_from_before_the_job_credentials_are_shipped_first_and_no_stream_is_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the agent's first lines, logged while it waits for vend (nothing ships yet)
    monkeypatch.setattr(spotrelay.agent.logs, "SHIP_INTERVAL_SECONDS", 0.05)
    logger = logging.getLogger("test.agent.shipping.early")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    stamps = OneLinePerMillisecond()
    logger.addFilter(stamps)
    log = JobLogger("job-1", 1, logger)
    early = EarlyLines.attach(logger)
    for n in range(3):
        log.info("asking vend", extra={"line": f"early {n}"})
    # When vend answers, and the agent ships with the job's credentials to the stream vend made
    client = WriteOnlyLogs()
    handler = ship_to_cloudwatch(client, "/spotrelay/SpotRelay/agent", "job-1/00001", logger, create_stream=False)
    early.hand_to(handler, logger)
    log.info("job output", extra={"line": "later"})
    handler.close()
    logger.removeHandler(handler)
    logger.removeFilter(stamps)
    # Then the stream holds the early lines first, then the rest; and the agent never tried to create it
    assert [event.get("line") for event in client.shipped] == ["early 0", "early 1", "early 2", "later"]
    assert client.created == []
    assert early not in logger.handlers


def test_early_lines_are_bounded_to_the_newest() -> None:
    logger = logging.getLogger("test.agent.shipping.bounded")
    logger.propagate = False
    early = EarlyLines(limit=5)
    logger.addHandler(early)
    for n in range(12):
        logger.warning("line %d", n)
    received: list[str] = []
    shipper = logging.Handler()
    shipper.emit = lambda record: received.append(record.getMessage())  # type: ignore[method-assign]
    early.hand_to(shipper, logger)
    logger.warning("after")  # no longer kept: the shipper is the logger's handler from here
    assert received == [f"line {n}" for n in range(7, 12)]
    assert early not in logger.handlers


class RejectingLogs(FailingLogs):
    """CloudWatch Logs that takes every batch but rejects, as too old, its leading events whose line is in
    `too_old` (`rejectedLogEventsInfo.tooOldLogEventEndIndex`, an exclusive end), as AWS answers."""

    def __init__(self) -> None:
        super().__init__(network_down)
        self.too_old: set[str] = set()

    def put_log_events(self, **kwargs: Any) -> dict[str, Any]:
        events = [json.loads(event["message"]) for event in kwargs["logEvents"]]
        end = next((i for i, event in enumerate(events) if event.get("line") not in self.too_old), len(events))
        self.shipped.extend(events[end:])
        return {"nextSequenceToken": "t"} | ({"rejectedLogEventsInfo": {"tooOldLogEventEndIndex": end}} if end else {})


@pytest.mark.filterwarnings("ignore:Failed to deliver logs")
def test_events_cloudwatch_rejects_in_a_batch_it_takes_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    client = RejectingLogs()
    with shipping(client, monkeypatch) as (log, handler):
        # Given a batch whose first 2 lines CloudWatch Logs rejects as too old, and takes the third
        client.too_old = {"old 0", "old 1"}
        for line in ("old 0", "old 1", "kept"):
            log.info("job output", extra={"line": line})
        handler.flush()
        assert [event.get("line") for event in client.shipped] == ["kept"]
        # When the job prints another line
        log.info("job output", extra={"line": "after"})
    # Then the stream says 2 lines are missing, before that line
    assert [event.get("line") for event in client.shipped] == ["kept", None, "after"]
    assert client.shipped[1]["message"] == UNSHIPPED
    assert client.shipped[1]["lines"] == 2
