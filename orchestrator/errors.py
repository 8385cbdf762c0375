"""Exceptions that carry a decision, caught in one place each.

`QualityError` ends an iteration because the model struggled; the iteration
runner rolls back and writes its reason and correction to notes.md.
The others are not the model's fault and never become struggle notes.
"""

from __future__ import annotations


class QualityError(Exception):
    """A severe struggle: stop this iteration, roll back, tell the next one why."""

    def __init__(self, reason: str, correction: str, evidence: str = "", message: str = "", tokens: int = 0) -> None:
        super().__init__(f"{reason}: {correction}")
        self.reason = reason
        # What the next iteration is told to do instead.
        self.correction = correction
        # What was seen (the repeated call, the check's output), for notes.md.
        self.evidence = evidence
        # A few words for the severe signal, e.g. "loop: read_file x4".
        self.message = message or (evidence.splitlines()[0][:80] if evidence else reason)
        # Tokens a model response used before it was cut off (runaway output, silence): they count.
        self.tokens = tokens


class ModelUnreachable(Exception):
    """The model endpoint stayed down or kept failing after every retry."""

    reason = "model_unreachable"
    exit_code = 3


class Cancelled(Exception):
    """The iteration was stopped on purpose (signal, deadline); nobody's fault."""

    reason = "cancelled"

    def __init__(self, why: str = "cancelled", tokens: int = 0) -> None:
        super().__init__(why)
        self.why = why
        # Tokens of a model response the cancel cut off mid-stream: the server spent them all the same.
        self.tokens = tokens


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""

    exit_code = 2


class StateError(Exception):
    """The state directory or run store cannot be used (read-only, full, locked)."""

    exit_code = 4
