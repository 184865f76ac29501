"""What a Step Functions error tells Recover and Finalize: the error's kind (`end_kind`), the JSON object its
Cause holds, read within bounds (`parsed_cause`: a worker fails its own task with any Cause it likes), the
exit code in it, and the one line a failed job keeps as its `failure_reason`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from spotrelay.config import ERROR_INSTANCE_LOST, ERROR_JOB_FAILED, ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.control.decisions import MAX_FAILURE_REASON_CHARS
from spotrelay.control.dispatcher import printable
from spotrelay.policy import EndKind

# What of a Step Functions error's Cause is parsed as JSON (Recover's exit code, a Lambda error's message).
# A worker fails its own task with any Cause it likes, and Step Functions takes up to 32,768 characters: a
# longer one, or one nested deeper than any Cause we write (the agent's and Lambda's are 1 and 2 deep), is
# opaque, never parsed (json.loads recurses once per level: 16,000 brackets raise RecursionError).
MAX_CAUSE_CHARS_PARSED = 32_768
MAX_CAUSE_DEPTH = 32
# An exit code read from a Cause: a process's (0-255, or minus a signal's number) fits in 32 bits; anything
# else is no exit code (and would not fit on the failure reason's line).
MAX_EXIT_CODE = 2**31 - 1
# Step Functions' bound on an error's name (SendTaskFailure's `error`)
MAX_ERROR_NAME_CHARS = 256

_ERROR_KINDS: dict[str, EndKind] = {
    ERROR_SPOT_INTERRUPTED: EndKind.SPOT_INTERRUPTED,
    ERROR_MIGRATING: EndKind.MIGRATED,
    ERROR_INSTANCE_LOST: EndKind.INSTANCE_LOST,
    ERROR_JOB_FAILED: EndKind.JOB_FAILED,
    "States.HeartbeatTimeout": EndKind.HEARTBEAT_TIMEOUT,
    "States.Timeout": EndKind.HEARTBEAT_TIMEOUT,
}


def end_kind(error_name: str) -> EndKind:
    """The state machine's error name as an EndKind; anything unknown counts as a lost instance."""
    return _ERROR_KINDS.get(error_name, EndKind.INSTANCE_LOST)


def parsed_cause(cause: str) -> dict[str, Any] | None:
    """The JSON object a Step Functions error's Cause holds; None if it holds none, or is not parsed: over
    MAX_CAUSE_CHARS_PARSED characters, nested deeper than MAX_CAUSE_DEPTH, or beyond what json takes (an
    integer of more than 4,300 digits). Bounded before it is parsed: see MAX_CAUSE_CHARS_PARSED."""
    if not cause.startswith("{") or len(cause) > MAX_CAUSE_CHARS_PARSED or not _nested_within(cause, MAX_CAUSE_DEPTH):
        return None
    try:
        parsed = json.loads(cause)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, as is the integer-digits limit
        return None
    return parsed if isinstance(parsed, dict) else None


# A JSON string (escapes included; unterminated: to the end) or one bracket: what `_nested_within` counts
_JSON_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _nested_within(text: str, depth: int) -> bool:
    """Whether no bracket of `text` (outside its strings) opens more than `depth` levels deep: one scan, no
    recursion, before json.loads would recurse."""
    level = 0
    for match in _JSON_STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            level += 1
            if level > depth:
                return False
        elif token in ("]", "}"):
            level -= 1
    return True


def error_cause(error: Mapping[str, Any]) -> dict[str, Any]:
    """What Recover reads of the error's Cause (the agent's `{"exit_code": n, "log_tail": ...}`): its JSON
    object, or nothing when the Cause is not one, or too big or deep to parse (opaque: Recover still closes
    the attempt and decides, without an exit code)."""
    raw = error.get("Cause")
    return (parsed_cause(raw) if isinstance(raw, str) else None) or {}


def exit_code(cause: Mapping[str, Any]) -> int | None:
    """The Cause's exit code: an integer a process could exit with (not a boolean, not 4,000 digits)."""
    code = cause.get("exit_code")
    if isinstance(code, bool) or not isinstance(code, int) or abs(code) > MAX_EXIT_CODE:
        return None
    return code


def failure_reason(error: Mapping[str, Any]) -> str:
    """The error the state machine caught (`{"Error", "Cause"}`) as a job's `failure_reason`: one line of at
    most MAX_FAILURE_REASON_CHARS, its name and what it says. A Lambda function's error comes with its whole
    envelope as the Cause (errorMessage, errorType, requestId, stackTrace): only the message is kept."""
    name = str(error.get("Error") or ERROR_JOB_FAILED)
    cause = error.get("Cause")
    text = cause if isinstance(cause, str) else ""
    message = lambda_error_message(text)
    line = " ".join(f"{name}: {text if message is None else message}".split()) if text else name
    return printable(line, MAX_FAILURE_REASON_CHARS)


def lambda_error_message(cause: str) -> str | None:
    """The `errorMessage` of a Lambda error envelope, None if `cause` is not one (or is not parsed:
    `parsed_cause`)."""
    parsed = parsed_cause(cause)
    message = parsed.get("errorMessage") if parsed is not None and "errorType" in parsed else None
    return message if isinstance(message, str) else None
