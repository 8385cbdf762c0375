"""The morning report: what each task and iteration did, from the run store.

`as_json` is a public contract (tests outside this repository read it):
`run` and `tasks`; each task has name, outcome, branch, commit, iterations;
each iteration has number, outcome, reason, signals, tokens, turns;
`kept_branches` names the `overnight-kept/` branches of the run's tasks.
Other keys may be added, never removed or renamed.
"""

from __future__ import annotations

import shlex
from collections import Counter
from datetime import tzinfo
from typing import Any, Container, Iterable, Sequence

from orchestrator.cancel import SYSTEM_LOCAL_TIME
from orchestrator.deadline_cuts import DeadlineCuts, deadline_cuts
from orchestrator.printable import shortened, visible
from orchestrator.records import Level, Signal, counts_as_succeeded
from runs.views import IterationView, RunView, TaskView, worst_signal

# Paused is not parked: the model server could not be reached, and the task is worked again next night.
_TASK_MARKS = {"succeeded": "✔", "failed": "✖", "parked": "⏸", "paused": "↻", "cancelled": "⏹", "skipped": "↷", "running": "…"}
_LEVEL_MARKS = {"warning": "⚠", "severe": "✖"}
# A signal's message in the text report and the step summary: a glance, not the evidence (notes.md, --json).
MESSAGE_LIMIT = 200


def as_json(run: RunView, kept: Sequence[str] = ()) -> dict[str, Any]:
    """`kept`: the `overnight-kept/` branches of the run's tasks (report_inputs.kept_branches), every one: the text
    report names the newest, a script reading this may want to delete them all."""
    return {
        "run": {
            "id": run.id,
            "status": run.status,
            "exit_code": run.exit_code,
            "started_at": _iso(run.started_at),
            "finished_at": _iso(run.finished_at),
            "tokens": run.tokens,
            "deadline": cuts.as_json() if (cuts := deadline_cuts(run)) else None,
        },
        "tasks": [_task_json(task) for task in run.tasks],
        "kept_branches": list(kept),
    }


def _task_json(task: TaskView) -> dict[str, Any]:
    signals = task.signals
    return {
        "name": task.name,
        "outcome": task.outcome,
        "reason": task.reason,
        "branch": task.branch,
        "commit": task.commit or None,
        "worst_signal": _signal_json(worst_signal(signals)),
        "signal_counts": _counts(signals),
        "tokens": task.tokens,
        "unused_tokens": task.unused_tokens,
        "iterations": [_iteration_json(it) for it in task.iterations],
    }


def _iteration_json(iteration: IterationView) -> dict[str, Any]:
    return {
        "number": iteration.number,
        "outcome": iteration.outcome,
        "reason": iteration.reason or None,
        "signals": [s.as_dict() for s in iteration.signals],
        "worst_signal": _signal_json(worst_signal(iteration.signals)),
        "tokens": iteration.tokens,
        "turns": iteration.turns,
        "commit": iteration.commit or None,
        "transcript": iteration.transcript or None,
    }


def as_text(
    run: RunView, base: str = "main", *, process_gone: bool = False, zone: tzinfo | None = None, in_base: Container[str] = (),
    apart: Container[str] = (), kept: Sequence[str] = (),
) -> str:
    """`process_gone`: the run says `running` but its process no longer exists (killed, power lost). `zone`: the clock
    times are shown on, the one `[night] deadline` is read on (report_inputs.report_zone); this host's when None.
    `in_base`: task branches `base` already holds whole (report_inputs.branches_in): no review line, it would show nothing.
    `apart`: task branches that share no commit with `base` (report_inputs.branches_apart): their line compares the two
    trees, `base...branch` being git's `fatal: no merge base`.
    `kept`: the `overnight-kept/` branches of the run's tasks (report_inputs.kept_branches): a person's changes found in a
    worktree, kept there before a night cleaned it."""
    header = f"overnight run #{run.id} · {run.status}"
    if process_gone:
        header += f" · but its process (pid {run.pid}) is gone: the next `overnight run` records it as crashed"
    if run.exit_code is not None:
        header += f" · exit {run.exit_code}"
    header += f" · started {_short(run.started_at, zone)}"
    if run.finished_at:
        header += f" · finished {_short(run.finished_at, zone)}"
    header += f" · {counted(run.tokens, 'token')}"
    lines = [header, _tally(run.tasks)] if run.tasks else [header]
    if cuts := deadline_cuts(run):
        lines.append(deadline_line(cuts, zone))
    lines.append("")
    for task in run.tasks:
        lines += _task_lines(task)
    merges = [t for t in to_review(run) if t.branch not in in_base]
    if merges:
        lines.append("To review and merge:")
        # Quoted where a shell would read a name otherwise: a branch of the person's may be `fix(12)` or `it's`.
        lines += [_review_line(base, t.branch, t.branch in apart) for t in merges]
    if kept:
        lines += [""] if merges else []
        lines.append("Changes found in the tasks' worktrees, kept before a night cleaned them (delete each when done):")
        lines += _kept_lines(kept)
    if not run.tasks:
        lines.append("(no tasks ran)")
    # Each item is one line: whatever was interpolated into it stays on it, shown, not obeyed.
    return "\n".join(visible(line) for line in lines).rstrip() + "\n"


# Kept branches stay until a person deletes them: a report names the newest this many, not every one of a year's.
KEPT_SHOWN = 20


def _kept_lines(kept: Sequence[str]) -> list[str]:
    """A `git show` line for each of the newest KEPT_SHOWN kept branches (their names end in their UTC time), in `kept`'s
    order, and how many older ones are left out, with the command that lists them."""
    newest = set(sorted(kept, key=lambda branch: branch.rpartition("/")[2])[-KEPT_SHOWN:])
    lines = [f"  git show {shlex.quote(branch)}" for branch in kept if branch in newest]
    if len(kept) > len(newest):
        lines.append(f"  ({len(kept) - len(newest)} older not shown: git branch --list 'overnight-kept/*')")
    return lines


def _review_line(base: str, branch: str, apart: bool) -> str:
    """The `git diff` that shows a task's work: from where the branch left `base`; the two trees, said so, when they
    share no commit (`base`'s history rewritten under it, or cut short in a shallow clone: the cause is not said)."""
    if not apart:
        return f"  git diff {shlex.quote(base)}...{shlex.quote(branch)}"
    return f"  git diff {shlex.quote(base)} {shlex.quote(branch)}    # no commit in common with {shlex.quote(base)}: the whole trees compared"


def to_review(run: RunView) -> list[TaskView]:
    """The tasks whose work the morning reviews and merges: those that succeeded, and those an earlier run of this
    scheduled night committed."""
    return [t for t in run.tasks if t.outcome == "succeeded" or _done_earlier_tonight(t)]


def _tally(tasks: Iterable[TaskView]) -> str:
    """The night in one line, counted as the exit code and the step summary's heading count: the line a reader
    looks for first, which the header's exit code alone does not give."""
    tasks = list(tasks)
    succeeded = sum(counts_as_succeeded(t.outcome, t.reason) for t in tasks)
    others = Counter(t.outcome for t in tasks if not counts_as_succeeded(t.outcome, t.reason))
    rest = "".join(f", {count} {outcome}{_WHY_OUTCOME.get(outcome, '')}" for outcome, count in others.items())
    return f"{succeeded} of {len(tasks)} task(s) succeeded{rest}"


def deadline_line(cuts: DeadlineCuts, zone: tzinfo | None) -> str:
    """The deadline on the report's clock, and the tasks it ended: the night ran out of time, no fault of theirs.
    Also the step summary's line (ci_summary), so the job page and the morning report say it alike."""
    at = _short(cuts.at, zone) if cuts.at else "(its time not recorded)"
    ended = [f"{words}: {_names(names)}" for words, names in (("cut short", cuts.cut_short), ("not started", cuts.not_started)) if names]
    return f"deadline {at} · " + (" · ".join(ended) if ended else "no task cut short or left unstarted by it")


# A deadline's line names this many tasks of each kind, then counts the rest (--json names every one).
NAMES_SHOWN = 5


def _names(names: Sequence[str]) -> str:
    more = f", +{len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return ", ".join(shortened(name, KIND_LIMIT) for name in names[:NAMES_SHOWN]) + more


# What a reader could not tell from the word alone: paused is no fault of the model, and no note says why.
_WHY_OUTCOME = {"paused": " (the model server could not be reached; no note in notes.md)"}


# A scheduled night `serve` began again records these tasks without working them (orchestrator/ended_without_work.py).
_WORKED_EARLIER_TONIGHT = ("done_earlier_tonight", "failed_earlier_tonight", "parked_earlier_tonight")


def _done_earlier_tonight(task: TaskView) -> bool:
    """A task an earlier run of this scheduled night committed: its work is on the branch, unreviewed,
    and this run's report is the one the morning reads (the earlier run's is no longer the latest)."""
    return task.reason == "done_earlier_tonight" and bool(task.commit)


def _task_lines(task: TaskView) -> list[str]:
    mark = _TASK_MARKS.get(task.outcome, "?")
    where = f"{task.branch} @ {task.commit[:10]}" if task.commit else task.branch
    why = f" ({reason_in_words(task)})" if task.reason and task.outcome != "succeeded" else ""
    badge = _badge(badge_signals(task))
    worked = counted(len(task.iterations), "iteration")
    if not task.iterations and task.reason in _WORKED_EARLIER_TONIGHT:
        worked = "its iterations in an earlier run of this scheduled night"
        if task.outcome != "skipped":
            worked += " (notes.md says why they were rolled back)"
    lines = [f"{mark} {task.name}: {task.outcome}{why} · {where} · {worked}{_unused(task)}{badge}"]
    for it in task.iterations:
        reason = f" {it.reason}" if it.reason and it.reason != it.outcome else ""  # not "#1 cancelled cancelled"
        if it.outcome == "committed" and not it.commit:
            reason = " (no change: the check passed as it was)"
        turns, tokens = counted(it.turns, "turn"), counted(it.tokens, "token")
        lines.append(f"    #{it.number} {it.outcome}{reason} · {turns} · {tokens}{_badge(it.signals)}")
    lines.append("")
    return lines


def badge_signals(task: TaskView) -> tuple[Signal, ...]:
    """What a task's line is headed by: a success's committed iteration's signals (the stops it came through are on
    their own lines, and a ✖ beside ✔ read as a failure at a glance); any other task's, all of its iterations'."""
    return task.iterations[-1].signals if task.outcome == "succeeded" and task.iterations else task.signals


# A skipped task's `leased`, as the reader is shown it.
_LEASED_IN_WORDS = "another worker held it when this night stopped"


def reason_in_words(task: TaskView) -> str:
    """A task's reason as a reader is shown it: a parked task's names the stop that parked it (not `parked (parked)`),
    its last iteration's reason (as JUnit's type). Not how many in a row: the count goes on across an earlier run of a
    scheduled night and over cancelled iterations, which this run's iterations do not show (notes.md's `parked` entry
    says). A paused task's says what could not be reached and how (`detail`, redacted when recorded), and that it is
    worked again. A task skipped `leased` says another worker held it. Any other reason, and a parked task's with no
    iterations, as it is."""
    if task.outcome == "paused" and task.reason:
        detail = f": {shown}" if (shown := shown_detail(task)) else ""
        return f"{task.reason}{detail}; retried next night"
    if (task.outcome, task.reason) == ("skipped", "leased"):
        # Not this night's to work: the code alone read as a fault of the task's, or of this night's.
        return f"{task.reason}: {_LEASED_IN_WORDS}"
    if task.reason != "parked":
        return task.reason
    stopped_by = next((it.reason for it in reversed(task.iterations) if it.reason), "")
    return f"parked: {stopped_by} stopped iterations in a row" if stopped_by else task.reason


def shown_detail(task: TaskView) -> str:
    """What a task's reason code alone does not say, as the reports show it beside the code: a paused task's endpoint and
    error (task_runs.detail, redacted when recorded), cut to a glance; "" for any other task, or none recorded."""
    return shortened(task.detail, MESSAGE_LIMIT) if task.outcome == "paused" and task.reason and task.detail else ""


def _unused(task: TaskView) -> str:
    """The tokens of a first answer the task ended without taking: in no iteration's line, yet spent."""
    if not task.unused_tokens:
        return ""
    return f" · {counted(task.unused_tokens, 'token')} in a first answer no iteration took ({task.tokens} in all)"


def _badge(signals: Iterable[Signal]) -> str:
    """The worst signal, like a status-bar badge, and the others by kind: what went wrong, read without --json."""
    signals = list(signals)
    worst = worst_signal(signals)
    if worst is None:
        return ""
    others = list(signals)
    others.remove(worst)
    also = f" · also {_kinds(others)}" if others else ""
    return f" · {_LEVEL_MARKS[worst.level.value]} {worst.kind}: {shortened(worst.message, MESSAGE_LIMIT)}{also}"


# Past this many kinds a badge's line no longer reads at a glance; the rest are counted, and named in --json.
KINDS_SHOWN = 4
# A custom guard names its own kinds: one long name must not push the others off a readable line.
KIND_LIMIT = 40


def _kinds(signals: list[Signal]) -> str:
    """`✖ max_turns, ⚠ repeated_tool_call ×3, unknown_tool, +2 more kinds`: each kind once with how many times,
    severe before warning (each level's mark said once), then the most frequent, then the first seen."""
    tally = Counter((s.level, s.kind) for s in signals)
    ranked = sorted(tally, key=lambda key: (key[0] != Level.SEVERE, -tally[key]))
    parts: list[str] = []
    level: Level | None = None
    for key in ranked[:KINDS_SHOWN]:
        mark = f"{_LEVEL_MARKS[key[0].value]} " if key[0] != level else ""
        times = f" ×{tally[key]}" if tally[key] > 1 else ""
        parts.append(f"{mark}{shortened(key[1], KIND_LIMIT)}{times}")
        level = key[0]
    if len(ranked) > KINDS_SHOWN:
        parts.append(f"+{counted(len(ranked) - KINDS_SHOWN, 'more kind', 'more kinds')}")
    return ", ".join(parts)


def counted(count: int, one: str, many: str = "") -> str:
    """`1 turn`, `2 turns`, `0 turns`: the text report's wording, and the demo's progress lines' (the step summary and
    JUnit keep theirs)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def _counts(signals: Iterable[Signal]) -> dict[str, int]:
    return dict(Counter(s.level.value for s in signals))


def _signal_json(signal: Signal | None) -> dict[str, str] | None:
    return signal.as_dict() if signal else None


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def _short(value: Any, zone: tzinfo | None) -> str:
    """A stored time (UTC) on the reader's clock, named (`06:00 CET`): `[night] deadline` is read as local time. A clock
    with no name for it (TZ=`<>-1`) is named by its offset (`+0530`), not left unnamed."""
    if not value:
        return "?"
    local = value.astimezone(zone or SYSTEM_LOCAL_TIME)
    return local.strftime("%Y-%m-%d %H:%M ") + (local.strftime("%Z") or local.strftime("%z"))
