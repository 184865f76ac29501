"""How a refused job spec, or a refused YAML/JSON document, is reported: `JobSpecError` (the source and one
line per problem) and `_shown`, which quotes a value the user gave, bounded.

The field problems themselves (`field: what is wrong and what is allowed`) are worded by
spotrelay.field_problems. Siblings: spotrelay.models.job_spec (the spec, parsing it), spec_sections and
spec_rules (what it holds and allows), documents (reading a file or message within bounds).
"""

from __future__ import annotations

from spotrelay.field_problems import SHOWN_MAX_CHARS, one_line, shown


class JobSpecError(ValueError):
    """An invalid job spec. `problems` are `field: what is wrong and what is allowed`, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = one_line(source, limit=None)
        # each problem bounded: a 1 MB unknown key is named, not echoed whole onto the one error line
        self.problems = [one_line(p) for p in problems]
        super().__init__(f"{self.source}: {'; '.join(self.problems)}")


def _shown(value: object, *, quoted: bool = True) -> str:
    """A value a user gave, as a message quotes it: bounded (spotrelay.field_problems.shown); `quoted=False`:
    as its text."""
    if quoted:
        return shown(value)
    text = str(value) if not isinstance(value, str) else value
    return text if len(text) <= SHOWN_MAX_CHARS else text[: SHOWN_MAX_CHARS - 3] + "..."
