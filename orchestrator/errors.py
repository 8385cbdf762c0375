"""Exceptions that carry a decision, caught in one place each.

`QualityError` ends an iteration because the model struggled; the iteration
runner rolls back and writes its reason and correction to notes.md.
The others are not the model's fault and never become struggle notes.
"""

from __future__ import annotations


class QualityError(Exception):
    """A severe struggle: stop this iteration, roll back, tell the next one why."""

    def __init__(self, reason: str, correction: str, evidence: str = "") -> None:
        super().__init__(f"{reason}: {correction}")
        self.reason = reason
        self.correction = correction
        self.evidence = evidence


class ModelUnreachable(Exception):
    """The model endpoint stayed down or kept failing after every retry."""

    reason = "model_unreachable"


class Cancelled(Exception):
    """The iteration was stopped on purpose (signal, deadline); nobody's fault."""

    reason = "cancelled"

    def __init__(self, why: str = "cancelled") -> None:
        super().__init__(why)
        self.why = why


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


class StateError(Exception):
    """The state directory or run store cannot be used (read-only, full, locked)."""
