"""A night as a markdown table on the GitHub Actions job page.

GitHub renders whatever a step appends to the file named by
$GITHUB_STEP_SUMMARY; several steps (and several nights in one job) share that
file, so this only ever appends.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from orchestrator.errors import StateError
from orchestrator.printable import shortened, visible
from orchestrator.records import counts_as_succeeded
from orchestrator.report import MESSAGE_LIMIT, badge_signals, shown_detail
from runs.views import RunView, TaskView, worst_signal

STEP_SUMMARY_VARIABLE = "GITHUB_STEP_SUMMARY"
# GitHub drops a step's whole summary past 1 MiB ("upload aborted"): the rows past it are counted, not shown.
STEP_SUMMARY_BYTES = 1024 * 1024
# What markdown would act on in a message: emphasis, code, links and images, strikes, escapes.
_MARKDOWN_PUNCTUATION = re.compile(r"[\\`*_\[\]!~]")
# As the text report's: paused (the model server could not be reached, worked again next night) is not parked.
_MARKS = {"succeeded": "✅", "failed": "❌", "parked": "⏸️", "paused": "🔁", "cancelled": "⏹️", "skipped": "⏭️", "running": "⏳"}


def append_step_summary(run: RunView, path: Path | None = None, *, notes: Path | None = None) -> bool:
    """Append the summary to `path`, else to $GITHUB_STEP_SUMMARY; False when neither is set."""
    target = path or os.environ.get(STEP_SUMMARY_VARIABLE) or None
    if target is None:
        return False
    try:
        # After a step that left its last line open (`echo -n`), the heading would join that line.
        start = "\n" if os.path.isfile(target) and _ends_mid_line(target) else ""
        # Earlier steps' summaries are in files of their own; an earlier night of this step's is in this one.
        room = STEP_SUMMARY_BYTES - (os.path.getsize(target) if os.path.isfile(target) else 0) - len(start)
        # Not blocking: a named pipe nobody reads is refused (ENXIO) instead of holding the night's end.
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        os.set_blocking(descriptor, True)  # opened: a slow reader is waited for, not cut off at a full pipe
        with open(descriptor, "a", encoding="utf-8") as out:
            out.write(start + step_summary(run, notes=notes, room=room))
    except OSError as exc:
        raise StateError(f"cannot append the step summary to {target}: {exc.strerror or exc}") from None
    return True


def _ends_mid_line(path: str | Path) -> bool:
    try:
        with open(path, "rb") as existing:
            existing.seek(-1, os.SEEK_END)
            return existing.read(1) != b"\n"
    except OSError:  # empty, missing, or not a file one can seek in
        return False


def step_summary(run: RunView, *, notes: Path | None = None, room: int = STEP_SUMMARY_BYTES) -> str:
    """The markdown appended: a heading, one table row per task, where to read why; at most `room` bytes in UTF-8
    (the rows that would pass it are one last row that counts them), unless the heading alone takes more."""
    # A task skipped as done already (another worker's, or an earlier run's of this scheduled night) counts as
    # the exit code counts it.
    succeeded = sum(counts_as_succeeded(task.outcome, task.reason) for task in run.tasks)
    exit_text = f", exit {run.exit_code}" if run.exit_code is not None else ""
    lines = [
        f"## overnight run #{run.id}: {succeeded}/{len(run.tasks)} task(s) succeeded ({run.status}{exit_text})",
        "",
        "| task | outcome | reason | iterations | worst signal | branch / commit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    where = f"`{notes}`" if notes else "the `notes.md` artifact"
    end = ["", f"notes.md: why each iteration was rolled back and what the next one was told: {where} (or `overnight notes`).", ""]
    rows = [_row(task) for task in run.tasks] or ["| (no tasks ran) | | | | | |"]
    left = room - _size([*lines, *end])
    if _size(rows) > left:  # only then the row that counts the rest: a summary that fits was cut by its size
        left -= _size([_more(len(rows))])
    shown = 0
    while shown < len(rows) and (left := left - _size([rows[shown]])) >= 0:
        shown += 1
    lines += rows[:shown] + ([_more(len(rows) - shown)] if shown < len(rows) else [])
    return "\n".join(lines + end) + "\n"


def _size(lines: list[str]) -> int:
    """The bytes `lines` take in the summary, each with its line end."""
    return sum(len(line.encode("utf-8")) + 1 for line in lines)


def _more(count: int) -> str:
    return f"| … and {count} more task(s), past GitHub's 1 MiB for a step's summary: see `overnight report` or the JUnit report | | | | | |"


def _row(task: TaskView) -> str:
    # As the text report's badge: a success's committed iteration's, not the night's worst stop before it.
    worst = worst_signal(badge_signals(task))
    signal = f"{worst.level.value} `{worst.kind}`: {_literal(shortened(worst.message, MESSAGE_LIMIT))}" if worst else ""
    commit = f" @ `{task.commit[:10]}`" if task.commit else ""
    detail = f": {_literal(shown)}" if (shown := shown_detail(task)) else ""
    reason = f"`{task.reason}`{detail}" if task.reason else ""
    cells = [
        task.name,
        f"{_MARKS.get(task.outcome, '')} {task.outcome}".strip(),
        reason,
        str(len(task.iterations)),
        signal,
        f"`{task.branch}`{commit}",
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _cell(text: str) -> str:
    """One table cell: a pipe or a newline would break the row; a control character (a model-chosen
    name in a signal) is shown escaped; `<` is an entity, so an HTML tag or `<!--` in such a name
    cannot hide the rest of the page, and `&` is one too, so `&#x202E;` in such a name stays text."""
    return visible(" ".join(text.split())).replace("&", "&amp;").replace("|", "\\|").replace("<", "&lt;")


def _literal(text: str) -> str:
    """Text shown as typed, not rendered: a signal's message can hold a model-chosen name, and
    `![](https://…)` or `[approve](https://…)` there would be an image or a link on the job page."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\g<0>", text)
