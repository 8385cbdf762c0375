"""The night's reports for CI, written after it from what the run store recorded: the JUnit file (--junit) and
GitHub's step summary ($GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from orchestrator.errors import StateError

if TYPE_CHECKING:
    from datetime import tzinfo
    from pathlib import Path


def publish_for_ci(
    store: object, junit: Path | None, *, notes: Path, log: object, summary_refused: str = "", zone: tzinfo | None = None,
) -> None:
    """The JUnit file and the GitHub step summary, from what the store recorded; also after a cancel. `zone`: the clock
    the summary shows the deadline on, the morning report's (report_inputs.report_zone).

    A failure here (a disk filled in the night, an unwritable $GITHUB_STEP_SUMMARY) is logged,
    and the exit code stays the night's: 143 must still say SIGTERM, 1 still say a task failed.
    """
    from orchestrator.ci_summary import STEP_SUMMARY_VARIABLE, StepSummarySkipped, append_step_summary
    from orchestrator.junit import write_junit

    begun = store.begun_run_id  # type: ignore[attr-defined]
    # This night's run: in a store several state dirs share, the latest may be another machine's.
    night_run = store.run(begun) if begun is not None else None  # type: ignore[attr-defined]
    if night_run is None:
        return
    if junit is not None:
        _publish(lambda: write_junit(night_run, junit), log)
    summary = os.environ.get(STEP_SUMMARY_VARIABLE) or None
    if summary_refused:
        log.error("ci_report_failed", error=summary_refused)  # type: ignore[attr-defined]
    elif junit is not None and summary is not None and _same_file(summary, junit):
        # The markdown appended to the XML would leave the asked-for report one no CI can parse.
        reason = "$GITHUB_STEP_SUMMARY names the --junit file, which stays the JUnit report"
        log.warning("step_summary_skipped", path=summary, reason=reason)  # type: ignore[attr-defined]
    else:
        try:
            _publish(lambda: append_step_summary(night_run, notes=notes, zone=zone), log)
        except StepSummarySkipped as skipped:  # a file already (nearly) at GitHub's 1 MiB
            log.warning("step_summary_skipped", path=summary, reason=str(skipped))  # type: ignore[attr-defined]


def _publish(write: Callable[[], object], log: object) -> None:
    try:
        write()
    except StateError as error:
        log.error("ci_report_failed", error=str(error))  # type: ignore[attr-defined]


def _same_file(one: str | Path, other: str | Path) -> bool:
    """The same file, through a link or another spelling of its path too; by where the paths lead when one is not there."""
    try:
        return os.path.samefile(one, other)
    except OSError:  # the JUnit file could not be written, or the summary's is not made yet
        return os.path.realpath(one) == os.path.realpath(other)
