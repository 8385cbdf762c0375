"""The night's reports for CI, written after it from what the run store recorded: the JUnit file (--junit) and
GitHub's step summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import StateError

if TYPE_CHECKING:
    from pathlib import Path


def publish_for_ci(store: object, junit: Path | None, *, notes: Path, log: object, summary_refused: str = "") -> None:
    """The JUnit file and the GitHub step summary, from what the store recorded; also after a cancel.

    A failure here (a disk filled in the night, an unwritable $GITHUB_STEP_SUMMARY) is logged,
    and the exit code stays the night's: 143 must still say SIGTERM, 1 still say a task failed.
    """
    from orchestrator.ci_summary import append_step_summary
    from orchestrator.junit import write_junit

    begun = store.begun_run_id  # type: ignore[attr-defined]
    # This night's run: in a store several state dirs share, the latest may be another machine's.
    night_run = store.run(begun) if begun is not None else None  # type: ignore[attr-defined]
    if night_run is None:
        return
    publishers = [] if summary_refused else [lambda: append_step_summary(night_run, notes=notes)]
    if summary_refused:
        log.error("ci_report_failed", error=summary_refused)  # type: ignore[attr-defined]
    if junit is not None:
        publishers.insert(0, lambda: write_junit(night_run, junit))
    for publish in publishers:
        try:
            publish()
        except StateError as error:
            log.error("ci_report_failed", error=str(error))  # type: ignore[attr-defined]
