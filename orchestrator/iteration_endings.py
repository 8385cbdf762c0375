"""How an iteration ends: committed, rolled back with its notes.md entry, cancelled with a no-blame one, model
unreachable (no note), or the state dir failing; each ending leaves the store, notes.md and the worktree consistent."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import QualityError, StateError
from orchestrator.iteration_setup import Iteration
from orchestrator.records import IterationOutcome, IterationReport

CANCELLED_CORRECTION = "None needed: the iteration was stopped ({why}), not because of the model."
STATE_FAILED_CORRECTION = "None: the state dir could not be written (disk full or read-only)."


def _logged(commit: str) -> str | None:
    """A commit as the log names it: its first 12 hex digits; null, as in `report --json`, when the iteration made none."""
    return commit[:12] or None


@dataclass
class Finisher:
    """The endings of an iteration, each leaving store, notes and worktree consistent."""

    iteration: Iteration
    recorded: bool = False  # the store has the iteration's end
    commit: str = ""
    committed_ending: dict[str, Any] | None = None  # once the work passed the check and is on the branch

    def committed(self, commit: str, turns: int, tokens: int) -> IterationReport:
        self.commit = commit
        self.committed_ending = {"outcome": IterationOutcome.COMMITTED.value, "commit": commit, "turns": turns, "tokens": tokens}
        self._finish(**self.committed_ending)
        self.iteration.log.info("iteration_committed", commit=_logged(commit), turns=turns, tokens=tokens)
        return self._report(IterationOutcome.COMMITTED, "", commit, turns, tokens)

    def rolled_back(self, stop: QualityError, turns: int, tokens: int) -> IterationReport:
        setup = self.iteration.setup
        setup.workspace.rollback(self.iteration.checkpoint)
        self._noted(
            # notes.md, which the next prompt carries: an error's text, or paths a refusal names, may hold a secret.
            evidence=setup.redact(stop.evidence),
            # A guard's correction may quote the model's call (a tool it named after a value it read).
            outcome=IterationOutcome.ROLLED_BACK.value, reason=stop.reason, correction=setup.redact(stop.correction), turns=turns,
            tokens=tokens,
        )
        self.iteration.log.info("iteration_rolled_back", reason=stop.reason, turns=turns, tokens=tokens)
        return self._report(IterationOutcome.ROLLED_BACK, stop.reason, "", turns, tokens)

    def state_failed(self) -> None:
        iteration = self.iteration
        # Work that passed the check and was committed stays, as recovery would keep it.
        iteration.setup.workspace.rollback(self.commit or iteration.checkpoint)
        # Recorded already when what failed came after the store had the iteration's end (notes.md).
        if not self.recorded:
            # The store failed as it recorded the commit (locked a moment, say): asked again, it must
            # say what the branch holds, the commit, not a rollback that never happened.
            ending = self.committed_ending or {
                "outcome": IterationOutcome.ROLLED_BACK.value,
                "reason": "iteration_error",
                "correction": STATE_FAILED_CORRECTION,
                "turns": iteration.ctx.answered,
                "tokens": iteration.ctx.tokens,
            }
            with contextlib.suppress(StateError):  # the store may be what failed; recovery then settles it
                self._finish(**ending)
                if self.committed_ending is not None:  # the store has the commit now: so has the log, as for any commit
                    iteration.log.info("iteration_committed", commit=_logged(self.commit), turns=ending["turns"], tokens=ending["tokens"])
        iteration.log.error("iteration_state_failed")

    def unreachable(self, detail: str) -> None:
        iteration, ctx = self.iteration, self.iteration.ctx
        # Infrastructure, not a struggle: no note, no signal.
        iteration.setup.workspace.rollback(iteration.checkpoint)
        self._finish(
            outcome=IterationOutcome.ROLLED_BACK.value,
            reason="model_unreachable",
            turns=ctx.answered,
            tokens=ctx.tokens,
        )
        # Turns and tokens as the store has them: a night's log adds up to its report.
        iteration.log.warning("iteration_model_unreachable", detail=detail, turns=ctx.answered, tokens=ctx.tokens)

    def cancelled(self, why: str) -> None:
        iteration, ctx = self.iteration, self.iteration.ctx
        iteration.setup.workspace.rollback(iteration.checkpoint)
        self._noted(
            outcome=IterationOutcome.CANCELLED.value,
            reason="cancelled",
            correction=CANCELLED_CORRECTION.format(why=why),
            turns=ctx.answered,
            tokens=ctx.tokens,
        )
        iteration.log.info("iteration_cancelled", why=why, turns=ctx.answered, tokens=ctx.tokens)

    def _noted(self, *, evidence: str = "", **ending: Any) -> None:
        """The ending in the store with its notes.md entry owed, the entry, then the entry marked
        written. Killed or failed before the mark (a full disk ends the night), the entry stays owed
        and the next night's recovery writes it from the store, unless notes.md has it already: the
        entry's header shows the very time the store has for the ending."""
        iteration, setup = self.iteration, self.iteration.setup
        ended = setup.store.now()
        self._finish(**ending, note_owed=True, at=ended)
        setup.notes.append(
            task=setup.task.name, iteration=iteration.number, reason=ending["reason"], correction=ending["correction"],
            evidence=evidence, when=ended,
        )
        setup.store.note_written(iteration.id)

    def _finish(self, **values: Any) -> None:
        self.iteration.setup.store.finish_iteration(self.iteration.id, **values)
        self.recorded = True

    def _report(self, outcome: IterationOutcome, reason: str, commit: str, turns: int, tokens: int) -> IterationReport:
        return IterationReport(
            number=self.iteration.number, outcome=outcome, reason=reason, commit=commit, turns=turns, tokens=tokens,
            signals=tuple(self.iteration.ctx.signals),
        )
