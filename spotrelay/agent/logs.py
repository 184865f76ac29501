"""Structured logs: one JSON object per line on stdout, each carrying the job id and attempt.

systemd sends the agent's stdout to the journal; with a log group (`--log-group`, which the worker's
unit sets to the stack's), the same lines also go to CloudWatch Logs, one stream per attempt named
`<job id>/<attempt, 5 digits>`, where `spotrelay logs JOB_ID` reads them. A line looks like

    {"time": "2026-11-30T12:00:05.123Z", "level": "INFO", "message": "checkpoint committed",
     "job_id": "job-1", "attempt": 2, "seq": 3, "uploaded_files": 1, ...}

Call sites log a fixed message with the details as `extra={...}` (never an f-string of the payload).
The job's own output is forwarded line by line as `{"message": "job output", "line": ...}`.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import warnings
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

LOGGER_NAME = "spotrelay.agent"
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger whose every line carries `job_id` and `attempt`, merged with the call's `extra`."""

    def __init__(self, job_id: str, attempt: int, logger: logging.Logger | None = None) -> None:
        super().__init__(logger or logging.getLogger(LOGGER_NAME), {"job_id": job_id, "attempt": attempt})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(kwargs.get("extra") or {}), **(self.extra or {})}
        return msg, kwargs


def configure_json_logging(stream: TextIO | None = None, level: int = logging.INFO) -> logging.Handler:
    """Send the agent's logs to `stream` (stdout) as JSON lines; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return handler


# Lines waiting for CloudWatch Logs at most (about 30 MB of agent lines): past it, they go to the journal only
MAX_QUEUED_LINES = 100_000
AGENT_DONE = "agent done"  # the agent's last line (`spotrelay logs --follow` stops at it)
UNSHIPPED = "log lines not shipped while CloudWatch Logs did not take them (they are in the instance's journal)"
# Batches leave at most this often (watchtower's send_interval): `spotrelay logs --follow` lags by about as much.
SHIP_INTERVAL_SECONDS = 5


class _TellsDelivery:
    """The CloudWatch Logs client, but each thread can tell whether a PutLogEvents it made got through:
    watchtower's `_submit_batch` keeps the answer to itself, and gives up on a batch with a warning only."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.sent = threading.local()  # `.through`: one of this thread's calls got an answer since it was reset

    def __getattr__(self, name: str) -> Any:  # everything else (exceptions, other calls) is the client's own
        return getattr(self._client, name)

    def put_log_events(self, **kwargs: Any) -> Any:
        answer = self._client.put_log_events(**kwargs)
        self.sent.through = True
        # CloudWatch Logs takes a batch yet rejects the events it finds too old, expired or too new
        # (`rejectedLogEventsInfo`, PutLogEvents, Amazon CloudWatch Logs API Reference): lines lost too
        rejected = answer.get("rejectedLogEventsInfo") if isinstance(answer, dict) else None
        self.sent.rejected = _rejected_lines(kwargs.get("logEvents", []), rejected) if rejected else 0
        return answer


def _rejected_lines(events: list[dict[str, Any]], rejected: dict[str, Any]) -> int:
    """How many of the agent's lines the rejected events of a batch stand for (`_lines_in`): the events from
    `tooNewLogEventStartIndex` on, and those before `tooOldLogEventEndIndex` or `expiredLogEventEndIndex`."""
    too_new = rejected.get("tooNewLogEventStartIndex")
    old_end = max(int(rejected.get("tooOldLogEventEndIndex") or 0), int(rejected.get("expiredLogEventEndIndex") or 0))
    start = len(events) if too_new is None else int(too_new)
    return sum(_lines_in(event) for i, event in enumerate(events) if i < old_end or i >= start)


def _lines_in(event: dict[str, Any]) -> int:
    """How many of the agent's lines a lost event stands for: one, or for a count of lines already missing, that
    count. A count lost with its batch is counted again (in the next one) rather than sent again, so a count that
    keeps failing never loops, and the number the stream finally gets still covers every line it lacks."""
    if UNSHIPPED in event["message"]:  # a quick look first: a lost batch may be 10,000 lines
        try:
            line = json.loads(event["message"])
        except ValueError:
            return 1
        if isinstance(line, dict) and line.get("message") == UNSHIPPED and isinstance(line.get("lines"), int):
            return int(line["lines"])
    return 1


class EarlyLines(logging.Handler):
    """The agent's lines from before it can ship them (it ships with the job's credentials, which vend gives
    it first): kept in memory, at most `limit` of them (the newest), and handed to the shipper once there is
    one. They are on stdout (the journal) all along."""

    def __init__(self, limit: int = 1000) -> None:
        super().__init__()
        self.lines: collections.deque[logging.LogRecord] = collections.deque(maxlen=limit)

    @classmethod
    def attach(cls, logger: logging.Logger | None = None) -> EarlyLines:
        early = cls()
        (logger or logging.getLogger(LOGGER_NAME)).addHandler(early)
        return early

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record)

    def hand_to(self, shipper: logging.Handler | None, logger: logging.Logger | None = None) -> None:
        """Stop keeping lines; give the shipper (if any) those kept, oldest first."""
        (logger or logging.getLogger(LOGGER_NAME)).removeHandler(self)
        kept = list(self.lines)
        self.lines.clear()
        if shipper is not None:
            for record in kept:
                shipper.handle(record)


def ship_to_cloudwatch(
    client: Any,
    log_group: str,
    stream: str,
    logger: logging.Logger | None = None,
    *,
    max_queued: int = MAX_QUEUED_LINES,
    create_stream: bool = True,
) -> logging.Handler:
    """Send the agent's log lines (the job's output among them) to `log_group`/`stream` too, in batches
    from a background thread (watchtower); returns the handler, whose close() sends what is left. The log
    group is the stack's: never created here. Failures to deliver are warnings, never the job's problem:
    while CloudWatch Logs does not take them, at most `max_queued` lines wait (beyond watchtower's batch in
    flight), later ones are left to the journal and counted, and so are those of a batch watchtower gives up
    on; the stream says how many once lines flow again (or at close). `logger`: the agent's (spotrelay.agent)
    unless given. `create_stream=False`: the stream exists already (vend made it: the job's credentials may
    write to it but not create it)."""
    import watchtower

    class BoundedHandler(watchtower.CloudWatchLogHandler):
        """watchtower's handler with a bounded queue: its own grows without end while sends fail. And with the
        lines of the batches it gives up on counted: it drops them with a warning only.

        Relies on watchtower 3.4.0 internals (besides `queues`, `threads` and `creating_log_stream`): its sender
        thread hands each batch, a list of {"timestamp", "message"} events, to `_submit_batch`, which calls
        `cwl_client.put_log_events` until one answers (5 tries in a row) and otherwise only warns; and `flush()`
        returns once the sender has submitted everything queued before it."""

        dropped = 0  # lines left out at the bound (on the agent's threads, under the handler's lock)
        lost = 0  # lines of batches given up on (on watchtower's thread, under `tally`)
        last: logging.LogRecord | None = None  # the latest line given: its job id and attempt label the count
        cwl_client: Any  # watchtower's (untyped): the client it calls, here the one given, wrapped

        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            # Its own lock, not the handler's: logging.shutdown() holds that one while close() waits for the
            # sender, which would then wait for it to count a lost batch
            self.tally = threading.Lock()
            self.delivery = self.cwl_client = _TellsDelivery(client)

        def emit(self, record: logging.LogRecord) -> None:
            waiting = self.queues.get(stream)
            # Warnings, errors and the agent's last line always go: they are few, and they matter most
            kept = record.levelno >= logging.WARNING or record.getMessage() == AGENT_DONE
            self.last = record
            if waiting is not None and waiting.qsize() >= max_queued and not kept:
                if not self.dropped:
                    note = {"level": "WARNING", "message": "log lines not shipped: CloudWatch Logs is not taking them"}
                    sys.stderr.write(json.dumps(note | {"log_group": log_group, "stream": stream}) + "\n")
                self.dropped += 1
                return
            if self.dropped or self.lost:
                self._count_dropped()
            self._put(record)

        def _put(self, record: logging.LogRecord) -> None:
            waiting = self.queues.get(stream)
            if self.creating_log_stream and waiting is not None and threading.current_thread() not in self.threads:
                # watchtower drops every line, from any thread, while its sender recreates the stream (a guard
                # against its own recursion): a line of the agent's goes to the queue here instead
                waiting.put({"timestamp": int(record.created * 1000), "message": self.format(record)})
                return
            super().emit(record)  # type: ignore[no-untyped-call]

        def _submit_batch(self, batch: list[dict[str, Any]], log_stream_name: str, max_retries: int = 5) -> None:
            """watchtower's, on its sender thread, but a batch it gives up on (every try failed) is counted, to
            be told in the stream with the lines left out at the bound: whichever way they were lost, the
            stream says how many lines it lacks."""
            if not batch:  # the sender's every interval, lines or not
                return
            sent = self.delivery.sent
            sent.through, sent.rejected = False, 0
            try:
                super()._submit_batch(batch, log_stream_name, max_retries)  # type: ignore[no-untyped-call]
            except Exception as e:
                # watchtower 3.4.0 lets out an error that is not a ClientError from the CreateLogStream it makes
                # when the stream is not there (a connection error, say): that would end its sender, and every
                # later line would wait in the queue until close gave up on it. The batch is lost like any other
                warnings.warn(f"Failed to deliver logs: {e}", watchtower.WatchtowerWarning, stacklevel=1)
            lines = sent.rejected if sent.through else sum(map(_lines_in, batch))
            if lines:
                with self.tally:
                    self.lost += lines

        def _count_dropped(self) -> None:
            with self.tally:
                lost, self.lost = self.lost, 0
            dropped, self.dropped = self.dropped, 0
            note = logging.LogRecord(LOGGER_NAME, logging.WARNING, __file__, 0, UNSHIPPED, None, None)
            note.lines = dropped + lost
            for key in ("job_id", "attempt"):  # the agent's lines carry them: so does this one
                setattr(note, key, getattr(self.last, key, None))
            if self.last is not None:
                # Stamped with the time of the line it comes with (the first one through, or at close the last
                # one left out), not with its own: CloudWatch Logs orders a stream (and watchtower a batch) by
                # timestamp, so a note made a millisecond after that line was made would land behind it
                note.created, note.msecs = self.last.created, self.last.msecs
                note.relativeCreated = self.last.relativeCreated
            self._put(note)

        def close(self) -> None:
            if self.shutting_down:  # closed already: nothing more is sent
                super().close()  # type: ignore[no-untyped-call]
                return
            # What is queued, and the batch in flight, are sent first: a batch lost last is counted below
            self.flush()  # type: ignore[no-untyped-call]
            self.acquire()
            try:
                if self.dropped or self.lost:  # the last lines were the ones lost: say so before the end
                    self._count_dropped()
            finally:
                self.release()
            super().close()  # type: ignore[no-untyped-call]

    if create_stream:
        try:
            # Here rather than by watchtower, which creates it only after a send fails, dropping what is logged
            # meanwhile. An agent restarted for the same attempt finds it there.
            client.create_log_stream(logGroupName=log_group, logStreamName=stream)
        except client.exceptions.ResourceAlreadyExistsException:
            pass
        except Exception as e:  # shipping logs must never stop the job; watchtower tries again
            logging.getLogger(LOGGER_NAME).warning(
                "could not create the log stream", extra={"log_group": log_group, "stream": stream, "error": str(e)}
            )
    handler = BoundedHandler(
        log_group_name=log_group,
        log_stream_name=stream,
        boto3_client=client,
        send_interval=SHIP_INTERVAL_SECONDS,
        create_log_group=False,
        create_log_stream=create_stream,  # in case the call above failed
    )
    handler.setFormatter(JsonLineFormatter())
    (logger or logging.getLogger(LOGGER_NAME)).addHandler(handler)
    return handler
