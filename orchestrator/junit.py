"""A night as a JUnit XML report, so CI systems show each task as a test case.

One task is one <testcase>: succeeded passes; failed and parked carry a
<failure> whose message is the iterations' reason codes; paused (the model
was unreachable) and interrupted (the night died under it) are an <error>,
because they are the infrastructure's fault, not the task's; cancelled, and
skipped (leased by another worker, or done by one), are <skipped>; one the `[night] deadline` ended says so in its
<skipped>'s text, and the suite's properties name that deadline. The layout is the common subset that
GitHub's test-report actions, GitLab's `reports: junit` and Jenkins all read:
<testsuites> around one <testsuite name="overnight">.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.deadline_cuts import DEADLINE, DeadlineCuts, deadline_cuts
from orchestrator.errors import StateError
from orchestrator.files import replace_file
from orchestrator.printable import visible
from orchestrator.report import reason_in_words
from runs.views import IterationView, RunView, TaskView, worst_signal

SUITE = "overnight"
_FAILED = ("failed", "parked")
_SKIPPED = ("cancelled", "skipped")
# Characters XML 1.0 cannot carry at all (lone surrogates, U+FFFE, U+FFFF) that `visible` leaves as they are.
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def write_junit(run: RunView, path: Path) -> None:
    """Write `run` as JUnit XML to `path`, atomically: a reader never sees half a file.

    What is not a file (`/dev/stdout`, `/dev/null`, a pipe) is written into, not replaced;
    a file that was there keeps its permissions.
    """
    tree = ET.ElementTree(junit_element(run))
    ET.indent(tree)
    path = Path(path)
    try:
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            # Nothing there, or a link that leads to itself: the report replaces the link, as a dangling
            # one (the check before the night took a loop for nothing there, as Path.exists() does).
            if not isinstance(exc, FileNotFoundError) and exc.errno != errno.ELOOP:
                raise
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "wb") as out:
                tree.write(out, encoding="utf-8", xml_declaration=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Made as any new file is (0666 less the umask), so the CI's other users may read it; a
        # file that was there passes its own mode on.
        out = io.BytesIO()
        tree.write(out, encoding="utf-8", xml_declaration=True)
        replace_file(path, out.getvalue(), mode=stat.S_IMODE(mode) if mode is not None else None)
    except OSError as exc:
        raise StateError(f"cannot write JUnit report {path}: {exc.strerror or exc}") from None


def junit_element(run: RunView) -> ET.Element:
    """The <testsuites> element for `run`; separate from writing so it can be inspected."""
    # Named only where it ended a task: a night done before its deadline has nothing for CI to explain.
    cuts = cut if (cut := deadline_cuts(run)) and cut.ended_any else None
    cases = [_testcase(task, cuts) for task in run.tasks]
    verdicts = [_verdict(task) for task in run.tasks]
    counts = {
        "tests": str(len(cases)),
        "failures": str(verdicts.count("failure")),
        "errors": str(verdicts.count("error")),
        "skipped": str(verdicts.count("skipped")),
        "time": _seconds(run.started_at, run.finished_at),
    }
    root = ET.Element("testsuites", {"name": SUITE, **counts})
    suite = ET.SubElement(root, "testsuite", {"name": SUITE, **counts, "timestamp": _timestamp(run.started_at)})
    if run.host:
        suite.set("hostname", _clean(run.host))
    properties = ET.SubElement(suite, "properties")
    named = (("run_id", run.id), ("status", run.status), ("exit_code", run.exit_code), ("config", run.config_path))
    for name, value in (*named, ("deadline", _deadline_instant(cuts) if cuts else None)):
        if value not in (None, ""):
            ET.SubElement(properties, "property", {"name": name, "value": _clean(str(value))})
    suite.extend(cases)
    return root


def _verdict(task: TaskView) -> str:
    """passed, failure (the task's), error (the infrastructure's), or skipped."""
    if task.outcome == "succeeded":
        return "passed"
    if task.outcome in _SKIPPED:
        return "skipped"
    if task.outcome in _FAILED and task.reason != "interrupted":
        return "failure"
    # paused (model_unreachable), interrupted, or still "running" because the night died under it.
    return "error"


def _deadline_instant(cuts: DeadlineCuts) -> str | None:
    """The deadline in UTC, ISO 8601, as `overnight report --json` has it; None where the run kept no instant."""
    return cuts.at.astimezone(timezone.utc).isoformat() if cuts.at else None


def _testcase(task: TaskView, cuts: DeadlineCuts | None = None) -> ET.Element:
    case = ET.Element("testcase", {"classname": SUITE, "name": _clean(task.name), "time": _seconds(task.started_at, task.finished_at)})
    reasons = _reason_codes(task)
    # A parked task's own reason is `parked`: its type is what kept stopping it (its last iterations'
    # reason; not the newest distinct code, which an iteration in between may have brought), as for a failed one.
    stopped_by = next((iteration.reason for iteration in reversed(task.iterations) if iteration.reason), "")
    # One with no iterations of its own (`parked_earlier_tonight`): its reason says it all.
    last = (stopped_by if task.outcome == "parked" else task.reason) or task.reason or stopped_by or task.outcome
    verdict = _verdict(task)
    if verdict == "failure":
        _child(case, "failure", ", ".join(reasons) or last, last, _iteration_lines(task))
    elif verdict == "skipped":
        skipped = ET.SubElement(case, "skipped", {"message": (task.reason or "leased") if task.outcome == "skipped" else "cancelled"})
        if cuts and task.outcome == "cancelled" and task.reason == DEADLINE:
            # In the body: the message stays `cancelled`, as readers matching it have it.
            skipped.text = _clean(_ended_by(task, cuts))
    elif verdict == "error":
        why = task.reason or f"task left {task.outcome}"
        _child(case, "error", why, task.reason or task.outcome, _iteration_lines(task))
    where = f"branch: {task.branch}\ncommit: {task.commit or '(none)'}\n"
    ET.SubElement(case, "system-out").text = _clean(where)
    return case


def _ended_by(task: TaskView, cuts: DeadlineCuts) -> str:
    """What the deadline did to `task`: the night ran out of time, which a bare `cancelled` could not tell from a
    signal or a token budget."""
    at = _deadline_instant(cuts) or "(its time not recorded)"
    done = "cut it short" if task.name in cuts.cut_short else "came before it started"
    return f"the night's deadline {at} {done}"


def _child(case: ET.Element, tag: str, message: str, kind: str, body: str) -> None:
    element = ET.SubElement(case, tag, {"message": _clean(message), "type": _clean(kind)})
    element.text = _clean(body)


def _reason_codes(task: TaskView) -> list[str]:
    """Each distinct reason once, in the order the iterations met them."""
    codes: list[str] = []
    for iteration in task.iterations:
        if iteration.reason and iteration.reason not in codes:
            codes.append(iteration.reason)
    return codes


def _iteration_lines(task: TaskView) -> str:
    reason = reason_in_words(task)
    lines = [f"{task.name}: {task.outcome}" + (f" ({reason})" if reason else "")]
    lines += [_iteration_line(iteration) for iteration in task.iterations]
    return "\n".join(lines) + "\n"


def _iteration_line(iteration: IterationView) -> str:
    worst = worst_signal(iteration.signals)
    signal = f"{worst.level.value} {worst.kind}: {worst.message}" if worst else "no signal"
    reason = iteration.reason or "-"
    return f"#{iteration.number} {iteration.outcome} · reason {reason} · worst signal {signal} · {iteration.turns} turns"


def _seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "0.000"
    return f"{max(0.0, (end - start).total_seconds()):.3f}"


def _timestamp(moment: datetime | None) -> str:
    # The JUnit schema's timestamp has no zone; the store's times are UTC.
    return moment.strftime("%Y-%m-%dT%H:%M:%S") if moment else ""


def _clean(text: str) -> str:
    """`text` as XML can carry it, what was there still told: a control character (model output, a check's log) as
    its escape (`\\x1b`), as `overnight report` and `overnight notes` show it; tabs and line breaks kept. A carriage
    return is escaped too: an XML reader would have turned it into a line break."""
    return _NOT_XML.sub(_escape, visible(text, keep="\t\n"))


def _escape(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")
