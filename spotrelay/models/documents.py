"""Reading a YAML or JSON document, bounded before and while it is parsed (a file or a message is a
user's input): its size, nesting and nodes (`DocumentLimits`; `JOB_SPEC_LIMITS` for a job spec), aliases
expanded, keys given twice, long or ambiguous numbers. Every refusal is a `JobSpecError` naming the line.

Job specs (spotrelay.models.job_spec's `load_job_spec`), queue messages (the dispatcher), scenarios and
workloads are read with it. Siblings: spec_errors (how a refusal is reported).
"""

from __future__ import annotations

import json
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrelay.field_problems import PROBLEMS_SHOWN
from spotrelay.models.spec_errors import JobSpecError, _shown

# --- reading a document: bounded before and while it is parsed (a file or a message is a user's input) ---


@dataclass(frozen=True)
class DocumentLimits:
    """How much of a YAML or JSON document is read and parsed before it is refused."""

    max_bytes: int  # of the file, read no further
    max_depth: int  # mappings and lists inside one another
    max_nodes: int  # values, keys, mappings and lists, as expanded: a YAML alias counts its anchor's again
    what: str = "a job spec"  # what the document should be, for the messages


# A job spec is about 1 KiB, 3 levels deep and a few dozen nodes (events/jobs/resnet50.yaml: 693 bytes,
# depth 3); a job with a hundred environment variables and tags is still under 1,000 nodes, and the queue
# takes at most 256 KiB (spotrelay.aws.deployed_stack). Far above a real spec, and where PyYAML (pure Python, about
# 10,000 nodes a second) stops within a second: a 300-byte YAML "billion laughs" expands to 10^9 nodes.
JOB_SPEC_LIMITS = DocumentLimits(max_bytes=1024 * 1024, max_depth=32, max_nodes=10_000)
MAX_INTEGER_DIGITS = 100  # no field of a spec or a scenario needs more
OCTAL_LOOKING = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1 octal: 010 is 8 (0o10 and 0x10 say what they are)


def read_document(path: Path, limits: DocumentLimits = JOB_SPEC_LIMITS) -> str:
    """The text of a YAML or JSON file, read no further than `limits.max_bytes`: refused if it is larger, or
    is not UTF-8 text (a binary file)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the open, a device never end
            raise JobSpecError(str(path), ["not a regular file: give a YAML or JSON file"])
        with path.open("rb") as file:
            data = file.read(limits.max_bytes + 1)
    except JobSpecError:
        raise
    except (OSError, ValueError) as e:  # ValueError: a name no file can have (a NUL, an unpaired surrogate)
        raise JobSpecError(str(path), [f"cannot read: {getattr(e, 'strerror', None) or e}"]) from None
    return document_text(data, str(path), limits)


def document_text(data: bytes, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> str:
    """`data` (at most `limits.max_bytes`, or one byte more to say it is larger) as text."""
    if len(data) > limits.max_bytes:
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])
    if (nul := data.find(b"\0")) >= 0:
        raise JobSpecError(
            source, [f"holds a NUL byte (at byte {nul}): a binary file, not {limits.what} (YAML or JSON text)"]
        )
    try:
        return data.decode("utf-8-sig")  # a byte order mark some editors write is no part of the text
    except UnicodeDecodeError as e:
        raise JobSpecError(
            source,
            [f"not UTF-8 text (byte 0x{data[e.start]:02x} at {e.start}): {limits.what} is YAML or JSON, in UTF-8"],
        ) from None


def decode_document(text: str, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> Any:
    """YAML (of which JSON is a subset), with the line of a syntax error in the message, within `limits`.

    A key given twice in one mapping is refused: both parsers would keep the last silently (a second
    `limits:` block pasted below the first would replace it). So is a key that is a list or a mapping
    (YAML's `? [a, b]`): no field is named by one."""
    if len(text) > limits.max_bytes:  # at least as many bytes as characters
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])
    if text.lstrip().startswith(("{", "[")):
        # JSON as JSON: YAML would refuse tab-indented JSON, which many JSON writers produce.
        return decode_json(text, source, limits)
    import yaml  # here, not at the top: the Lambda functions parse JSON and their runtime has no PyYAML

    try:
        return yaml.load(text, Loader=_bounded_loader(source, limits))  # a SafeLoader: no Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise JobSpecError(source, [f"{where}not valid YAML or JSON ({problem})"]) from None


def decode_json(text: str, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> Any:
    """JSON within `limits` (the dispatcher reads queue messages with it): its size bounds its nodes (JSON
    has no aliases); its nesting is bounded by Python's recursion limit while parsing, then by
    `limits.max_depth`; an integer of more than MAX_INTEGER_DIGITS digits is refused as it is read (Python
    would spend quadratic time on it, and refuses past 4,300 digits with a ValueError); a key given twice
    in one object is refused."""
    if len(text) > limits.max_bytes:  # at least as many bytes as characters
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
            raise JobSpecError(
                source, [f"a number of {len(digits.lstrip('-'))} digits: no field of {limits.what} takes one"]
            )
        return int(digits)

    try:
        document = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, source), parse_int=integer)
    except json.JSONDecodeError as e:
        raise JobSpecError(source, [f"line {e.lineno}: not valid JSON ({e.msg})"]) from None
    except RecursionError:
        raise JobSpecError(source, [_too_deep(limits)]) from None
    _check_shape(document, source, limits)
    return document


def _bounded_loader(source: str, limits: DocumentLimits) -> Any:
    """A SafeLoader class that refuses, while it composes the document and before anything is built from
    it: nesting deeper than `limits.max_depth`, more than `limits.max_nodes` nodes with every alias
    expanded (a billion laughs is a few hundred bytes of aliases), an alias inside its own anchor, a key
    that is not a single value, and a key given twice."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self.nodes = 0  # composed so far, aliases expanded
            self.depth = 0
            self.expanded: dict[int, int] = {}  # id(node) -> its nodes, expanded, once it is composed

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]  # (untyped in types-PyYAML)
                anchored = self.anchors.get(event.anchor)
                if anchored is not None:  # (an unknown alias is the composer's error)
                    if id(anchored) not in self.expanded:
                        raise self._refused(event, f"*{event.anchor} is inside &{event.anchor} itself")
                    self._count(self.expanded[id(anchored)], event)
                return super().compose_node(parent, index)
            event = self.peek_event()  # type: ignore[no-untyped-call]  # (untyped in types-PyYAML)
            self.depth += 1
            if self.depth > limits.max_depth:
                raise self._refused(event, _too_deep(limits))
            self._count(1, event)
            before = self.nodes - 1
            node = super().compose_node(parent, index)
            self.expanded[id(node)] = self.nodes - before
            self.depth -= 1
            return node

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except JobSpecError:
                raise
            except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as e:
                # PyYAML's own constructors raise these, not a YAMLError, for a value its tag cannot hold: a
                # date that is none (2024-13-45), `!!int abc`, `!!bool maybe`, `!!float ''`
                kind = str(node.tag).rsplit(":", 1)[-1]
                why = f" ({e})" if type(e) is ValueError else ""
                raise JobSpecError(
                    source,
                    [
                        f"line {node.start_mark.line + 1}: {_shown(node.value)} reads as a YAML {kind}, and is not a "
                        f"valid one{why}; quote it if it is text"
                    ],
                ) from None

        def scan_flow_scalar_non_spaces(self, double: bool, start_mark: Any) -> Any:
            try:
                return super().scan_flow_scalar_non_spaces(double, start_mark)
            except ValueError:  # chr() of an escape past the last code point: "\U00110000"
                raise yaml.scanner.ScannerError(
                    "while scanning a double-quoted scalar",
                    start_mark,
                    "an escape past U+10FFFF, the last Unicode character",
                    self.get_mark(),
                ) from None

        def _count(self, nodes: int, event: Any) -> None:
            self.nodes += nodes
            if self.nodes > limits.max_nodes:
                raise self._refused(event, _too_many(limits))

        def _refused(self, event: Any, problem: str) -> JobSpecError:
            return JobSpecError(source, [f"line {event.start_mark.line + 1}: {problem}"])

        def construct_yaml_int(self, node: Any) -> Any:
            self._short_number(node)
            self._plain_number(node)
            if OCTAL_LOOKING.fullmatch(str(node.value)):
                raise self._number_refused(node, "YAML 1.1 reads a number with a leading 0 as octal (010 is 8)")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> Any:
            self._short_number(node)
            self._plain_number(node)
            return super().construct_yaml_float(node)

        def _plain_number(self, node: Any) -> None:
            if ":" in str(node.value):  # YAML 1.1's base 60: `work_hours: 1:30` would be 90 hours
                raise self._number_refused(node, "YAML 1.1 reads 1:30 as a base-60 number (90)")

        def _number_refused(self, node: Any, why: str) -> JobSpecError:
            line = node.start_mark.line + 1
            return JobSpecError(
                source, [f"line {line}: {node.value} is ambiguous: {why}; write the number plainly (1.5, 10)"]
            )

        def _short_number(self, node: Any) -> None:
            # as decode_json's: Python spends quadratic time on a long integer and refuses one past 4,300
            # digits (a ValueError, or an OverflowError made float); no field takes one anyway
            if len(str(node.value)) > MAX_INTEGER_DIGITS:
                line = node.start_mark.line + 1
                raise JobSpecError(
                    source, [f"line {line}: a number of {len(str(node.value))} characters: no field takes one"]
                )

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if not isinstance(node, yaml.MappingNode):  # (`!!map [1]`): PyYAML's error, naming the line
                return super().construct_mapping(node, deep=deep)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                    raise JobSpecError(source, [f"line {line}: a key is one word or number, not a {kind}"])
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise JobSpecError(source, [f"line {line}: {_shown(key, quoted=False)} is given twice; keep one"])
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
    return BoundedLoader


def _check_shape(document: Any, source: str, limits: DocumentLimits) -> None:
    """Refuse a decoded JSON document nested deeper than `limits.max_depth` or with more nodes than
    `limits.max_nodes` (as YAML's are refused while composed). Iterative: no recursion on deep input."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limits.max_depth:  # (counted as YAML's are: a value inside 32 lists is at depth 33)
            raise JobSpecError(source, [_too_deep(limits)])
        if isinstance(value, dict | list):
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
        nodes += 1
        if nodes > limits.max_nodes:
            raise JobSpecError(source, [_too_many(limits)])


def _too_deep(limits: DocumentLimits) -> str:
    return f"nested more than {limits.max_depth} levels deep: not {limits.what}"


def _too_many(limits: DocumentLimits) -> str:
    return f"more than {limits.max_nodes:,} keys and values (a YAML alias counts as all it repeats): not {limits.what}"


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n // 1024} KiB"


def _unique_keys(pairs: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    unique = dict(pairs)
    if len(unique) < len(pairs):
        twice = sorted(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        keys = ", ".join(_shown(key, quoted=False) for key in twice[:PROBLEMS_SHOWN])
        more = f" and {len(twice) - PROBLEMS_SHOWN} more" if len(twice) > PROBLEMS_SHOWN else ""
        raise JobSpecError(source, [f"{keys}{more} given twice in one object; keep one"])
    return unique
