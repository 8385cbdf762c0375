"""A night's end: its run recorded `cancelled` or `finished`, told on the log, and the exit code it leaves.

Exit codes are the public contract of `overnight run`:
0 every task succeeded; 1 at least one did not; 3 the model endpoint was unreachable;
129/130/143 the night was cancelled by SIGHUP/SIGINT/SIGTERM (128 + the signal's number,
as a shell reports a process the signal killed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from orchestrator.errors import ModelUnreachable
from orchestrator.records import DONE_EARLIER_TONIGHT, DONE_ELSEWHERE, TaskOutcome, counts_as_succeeded

if TYPE_CHECKING:
    from orchestrator.night_state import Night
    from orchestrator.task_night import TaskSummary

EXIT_OK, EXIT_TASKS_FAILED, EXIT_USAGE, EXIT_MODEL_UNREACHABLE = 0, 1, 2, ModelUnreachable.exit_code
EXIT_SIGHUP, EXIT_SIGINT, EXIT_SIGTERM = 129, 130, 143
# The signals that stop a night (its CancelToken's `why` names one), and the exit code each leaves.
SIGNAL_EXIT_CODES = {"SIGHUP": EXIT_SIGHUP, "SIGINT": EXIT_SIGINT, "SIGTERM": EXIT_SIGTERM}


@dataclass(frozen=True)
class NightResult:
    run_id: int
    exit_code: int
    tasks: tuple[TaskSummary, ...]


def night_ended(night: Night, summaries: Sequence[TaskSummary]) -> NightResult:
    """The run recorded and told `cancelled`, with its signal's exit code, when a signal stopped the night, else
    `finished`, with the tasks' (_exit_code)."""
    cancel, store = night.parts.cancel, night.parts.store
    if cancel.cancelled and cancel.why in SIGNAL_EXIT_CODES:
        exit_code = SIGNAL_EXIT_CODES[cancel.why]
        store.finish_run(night.run_id, status="cancelled", exit_code=exit_code)
        night.log.info("night_cancelled", why=cancel.why, exit_code=exit_code)
    else:
        exit_code = _exit_code(summaries)
        store.finish_run(night.run_id, status="finished", exit_code=exit_code)
        night.log.info(
            "night_finished",
            exit_code=exit_code,
            succeeded=sum(s.outcome is TaskOutcome.SUCCEEDED for s in summaries),
            # Skipped as done already: not this run's success, but the exit code counts them as the night's.
            done_already=sum(s.reason in (DONE_ELSEWHERE, DONE_EARLIER_TONIGHT) for s in summaries),
            stopped_early=_stopped_early(night, summaries),
        )
    return NightResult(run_id=night.run_id, exit_code=exit_code, tasks=tuple(summaries))


def _stopped_early(night: Night, summaries: Sequence[TaskSummary]) -> str | None:
    """What ended a finished night early (`night_finished`'s `stopped_early`): its stop, the deadline, the night's
    budget, or None."""
    return (
        night.parts.cancel.why
        # A task it refused before it came is `cancelled`, reason deadline, though its watcher never fired.
        or ("deadline" if any(summary.reason == "deadline" for summary in summaries) else None)
        # Likewise the budget: spent by a task's last answer (its submit committed) with nothing left to refuse,
        # it ended nothing early, and naming it sent the morning looking for work the budget had cut short.
        or (night.budget.why if any(summary.reason == night.budget.why for summary in summaries) else None)
    )


def _exit_code(summaries: Sequence[TaskSummary]) -> int:
    if any(s.reason == "model_unreachable" for s in summaries):
        return EXIT_MODEL_UNREACHABLE
    if summaries and all(counts_as_succeeded(s.outcome, s.reason) for s in summaries):
        return EXIT_OK
    return EXIT_TASKS_FAILED
