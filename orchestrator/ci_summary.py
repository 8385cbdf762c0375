"""A night as a markdown table on the GitHub Actions job page.

GitHub renders whatever a step appends to the file named by
$GITHUB_STEP_SUMMARY; several steps (and several nights in one job) share that
file, so this only ever appends.
"""

from __future__ import annotations

import os
import re
from datetime import tzinfo
from pathlib import Path

from orchestrator.deadline_cuts import deadline_cuts
from orchestrator.errors import StateError
from orchestrator.printable import shortened, visible
from orchestrator.records import counts_as_succeeded
from orchestrator.report import MESSAGE_LIMIT, badge_signals, deadline_line, shown_detail
from runs.views import RunView, TaskView, worst_signal

STEP_SUMMARY_VARIABLE = "GITHUB_STEP_SUMMARY"
# GitHub drops a step's whole summary past 1 MiB ("upload aborted"): the rows past it are counted, not shown.
STEP_SUMMARY_BYTES = 1024 * 1024
# What markdown would act on in a message: emphasis, code, links and images, strikes, escapes; and what only GitHub
# acts on: `$x$` is math, `@team` a mention that pings, `#123` a link to an issue. CommonMark lets any ASCII
# punctuation be backslash-escaped and shows it as typed; a `#` before anything but a digit, as in `&#x202E;`, links nothing.
_MARKDOWN_PUNCTUATION = re.compile(r"[\\`*_\[\]!~$@]|#(?=[0-9])")
# GitHub's emoji shortcodes, `:tada:` (🎉), and runs of them sharing colons (`:no:tada:`), once the above is escaped
# (`:+1_x:` is `:+1\_x:` by then): their colons are escaped, and only theirs, so `06:30` and `http://` stay as typed.
# A shortcode's name once escaped as above (a `_` in it carries a backslash by then).
_SHORTCODE_NAME = r"[A-Za-z0-9_+\\-]+"
_SHORTCODES = re.compile(rf":(?:{_SHORTCODE_NAME}:)+")
# GitHub finds mentions, issue links and emoji in the HTML's text after markdown has taken the backslashes away
# (github/markup#1168: `\@name` still pings): an empty HTML comment, which GitHub drops, splits each from its word.
_GITHUB_REFERENCE = re.compile(
    rf"(?<=\\@)(?=[A-Za-z0-9])|(?<=\\#)(?=[0-9])|(?<=\\:)(?={_SHORTCODE_NAME}\\:)"
)
_SPLIT = "<!-- -->"
# As the text report's: paused (the model server could not be reached, worked again next night) is not parked.
_MARKS = {"succeeded": "✅", "failed": "❌", "parked": "⏸️", "paused": "🔁", "cancelled": "⏹️", "skipped": "⏭️", "running": "⏳"}


class StepSummarySkipped(Exception):
    """Nothing was appended, for the reason this carries: logged as `step_summary_skipped`."""


def append_step_summary(run: RunView, path: Path | None = None, *, notes: Path | None = None, zone: tzinfo | None = None) -> bool:
    """Append the summary to `path`, else to $GITHUB_STEP_SUMMARY; False when neither is set. `zone`: the clock the
    deadline is shown on, as `overnight report` shows it (report_inputs.report_zone); this host's when None.

    Raises StepSummarySkipped when even the heading and the row that counts the tasks would take the file past
    GitHub's 1 MiB: GitHub would then drop the step's whole summary, the earlier steps' and nights' part too."""
    target = path or os.environ.get(STEP_SUMMARY_VARIABLE) or None
    if target is None:
        return False
    try:
        # After a step that left its last line open (`echo -n`), the heading would join that line.
        start = "\n" if os.path.isfile(target) and _ends_mid_line(target) else ""
        # Earlier steps' summaries are in files of their own; an earlier night of this step's is in this one.
        held = _held(target)
        room = STEP_SUMMARY_BYTES - held - len(start)
        summary = start + step_summary(run, notes=notes, room=room, zone=zone)
        if len(summary.encode("utf-8")) > STEP_SUMMARY_BYTES - held:
            raise StepSummarySkipped(
                f"the step's summary file holds {held} bytes already: this night's summary would take it past "
                f"GitHub's 1 MiB ({STEP_SUMMARY_BYTES} bytes), and GitHub would drop the step's whole summary"
            )
        # Not blocking: a named pipe nobody reads is refused (ENXIO) instead of holding the night's end.
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        os.set_blocking(descriptor, True)  # opened: a slow reader is waited for, not cut off at a full pipe
        with open(descriptor, "a", encoding="utf-8") as out:
            out.write(summary)
    except OSError as exc:
        raise StateError(f"cannot append the step summary to {target}: {exc.strerror or exc}") from None
    return True


def _held(target: str | Path) -> int:
    """The bytes of GitHub's 1 MiB the file holds already. None in a stream (a pipe, a terminal), nor in a file reached
    through one (`/dev/stdout` or `/dev/fd/1` that a shell sent into a log file): GitHub uploads only the file its
    runner named, never a stream, so there is no limit to keep there."""
    if os.path.abspath(target).startswith(("/dev/", "/proc/")):
        return 0
    return os.path.getsize(target) if os.path.isfile(target) else 0


def _ends_mid_line(path: str | Path) -> bool:
    try:
        with open(path, "rb") as existing:
            existing.seek(-1, os.SEEK_END)
            return existing.read(1) != b"\n"
    except OSError:  # empty, missing, or not a file one can seek in
        return False


def step_summary(run: RunView, *, notes: Path | None = None, room: int = STEP_SUMMARY_BYTES, zone: tzinfo | None = None) -> str:
    """The markdown appended: a heading, the deadline's line where it ended a task (and leaves room for the row that
    counts the tasks), one table row per task, where to read why; at most `room` bytes in UTF-8 (the rows that would
    pass it are one last row that counts them), unless the heading alone takes more."""
    # A task skipped as done already (another worker's, or an earlier run's of this scheduled night) counts as
    # the exit code counts it.
    succeeded = sum(counts_as_succeeded(task.outcome, task.reason) for task in run.tasks)
    exit_text = f", exit {run.exit_code}" if run.exit_code is not None else ""
    heading = [f"## overnight run #{run.id}: {succeeded}/{len(run.tasks)} task(s) succeeded ({run.status}{exit_text})", ""]
    table = ["| task | outcome | reason | iterations | worst signal | branch / commit |", "| --- | --- | --- | --- | --- | --- |"]
    where = _code(str(notes)) if notes else "the `notes.md` artifact"
    end = ["", f"notes.md: why each iteration was rolled back and what the next one was told: {where} (or `overnight notes`).", ""]
    rows = [_row(task) for task in run.tasks] or ["| (no tasks ran) | | | | | |"]
    deadline = _deadline_lines(run, zone)
    # Left out where it would leave no room for the heading and the row that counts the tasks: a file near GitHub's
    # 1 MiB still gets those (reference.md), rather than nothing.
    if _size([*heading, *deadline, *table, _more(len(rows)), *end]) > room:
        deadline = []
    lines = [*heading, *deadline, *table]
    left = room - _size([*lines, *end])
    if _size(rows) > left:  # only then the row that counts the rest: a summary that fits was cut by its size
        left -= _size([_more(len(rows))])
    shown = 0
    while shown < len(rows) and (left := left - _size([rows[shown]])) >= 0:
        shown += 1
    lines += rows[:shown] + ([_more(len(rows) - shown)] if shown < len(rows) else [])
    return "\n".join(lines + end) + "\n"


def _deadline_lines(run: RunView, zone: tzinfo | None) -> list[str]:
    """The report's deadline line and a blank one, where the deadline ended a task: a ⏹️ cancelled row does not say
    whether the night ran out of time or was stopped. Nothing for a night done before its deadline, or without one."""
    cuts = deadline_cuts(run)
    if cuts is None or not cuts.ended_any:
        return []
    return [_cell(_literal(deadline_line(cuts, zone))), ""]


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
        task.name,  # letters, digits, `.`, `_`, `-` only (it names a branch): nothing GitHub acts on
        f"{_MARKS.get(task.outcome, '')} {task.outcome}".strip(),
        reason,
        str(len(task.iterations)),
        signal,
        f"{_code(task.branch)}{commit}",
    ]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _cell(text: str) -> str:
    """One table cell: a pipe or a newline would break the row; a control character (a model-chosen
    name in a signal) is shown escaped; `<` is an entity, so an HTML tag or `<!--` in such a name
    cannot hide the rest of the page, and `&` is one too, so `&#x202E;` in such a name stays text."""
    escaped = _shown(_one_line(text)).replace("&", "&amp;").replace("|", "\\|").replace("<", "&lt;")
    return _GITHUB_REFERENCE.sub(_SPLIT, escaped)


def _one_line(text: str) -> str:
    """`text` with its runs of spaces, tabs and line breaks as one space. Only these: the separators \\x1c to \\x1f
    and \\x85, which `str.split()` takes for spaces too, are control characters to show as their escapes."""
    return re.sub(r"[ \t\r\n]+", " ", text).strip(" ")


def _code(text: str) -> str:
    """`text` as one code span on one line: fenced by one backtick more than its longest run of them (a `[state] dir`
    may hold some); a line break shown as `\\n`, and a backslash as `\\\\`, so a path holding a backslash and an `n`
    does not read as one holding a line break. A space inside the fence where it begins or ends with a backtick,
    and where it begins and ends with a space, which CommonMark would strip, one each side (unless all spaces)."""
    text = _shown(text.replace("\\", "\\\\"))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    spaced = text.startswith(" ") and text.endswith(" ") and text.strip(" ")
    pad = " " if text.startswith("`") or text.endswith("`") or spaced else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _shown(text: str) -> str:
    """`text` with its control characters escaped, and any lone surrogate too (a path's undecodable byte, `\\udcff`),
    which no UTF-8 file can hold."""
    return visible(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _literal(text: str) -> str:
    """Text shown as typed, not rendered: a signal's message can hold a model-chosen name, and
    `![](https://…)` or `[approve](https://…)` there would be an image or a link on the job page, `@team` a mention
    that pings the team, `:tada:` an emoji, `$x$` math and `#1` a link to issue 1."""
    escaped = _MARKDOWN_PUNCTUATION.sub(r"\\\g<0>", text)
    return _SHORTCODES.sub(lambda found: found.group().replace(":", "\\:"), escaped)
