"""One iteration: checkpoint, agent run, check, then commit or roll back with a note.

Whatever happens inside, the worktree ends either committed or exactly at its
checkpoint, and the run store says which. Here is its outline and the judging of
its work; how each ending is recorded is iteration_endings.py's, what it leaves
as it happens iteration_recorder.py's.
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from orchestrator.agent import RunContext, run_agent
from orchestrator.command_endings import how_it_ended
from orchestrator.config import NightConfig, TaskConfig
from orchestrator.errors import Cancelled, ModelUnreachable, QualityError, StateError
from orchestrator.iteration_endings import Finisher
from orchestrator.iteration_recorder import IterationRecorder
from orchestrator.iteration_setup import Iteration, TaskSetup
from orchestrator.passed_secrets import PassedSecrets, passed_secrets
from orchestrator.printable import shortened, visible
from orchestrator.prompt import build_messages
from orchestrator.protocols import Message, NotesBook
from orchestrator.records import AgentResult, IterationReport, KeptOutOfCommit, Level
from orchestrator.tokens import window_chars
from orchestrator.transcript import Transcript

CHECK_TAIL_CHARS = 1200
# Killed by a signal that stops nights: the process itself (negative), or the shell's child (128 + n).
_SIGNAL_DEATHS = {status for number in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM) for status in (-number, 128 + number)}
SIGNAL_GRACE_S = 1.0


def run_iteration(setup: TaskSetup, number: int) -> IterationReport:
    """Raises ModelUnreachable and Cancelled after rolling back; every other failure becomes a report."""
    checkpoint = setup.workspace.checkpoint()
    # The prompt (notes.md read) and the transcript (opened) before the iteration is recorded: a
    # state dir that cannot give or take them (unreadable, disk full) ends the night (StateError)
    # before anything says an iteration began, instead of leaving one `running` in an ended run.
    tool_names = setup.toolbox.names()
    messages = first_messages(setup.task, setup.night, tool_names, setup.notes, setup.context_window)
    transcript = Transcript(setup.transcripts_dir / f"task-run-{setup.task_run_id}-{setup.task.name}-{number}.jsonl")
    iteration_id = setup.store.begin_iteration(
        setup.task_run_id, number=number, checkpoint=checkpoint, pid=os.getpid(), transcript=str(transcript.path)
    )
    log = setup.log.bind(iteration=number, iteration_id=iteration_id)
    log.info("iteration_started", checkpoint=checkpoint[:12])
    with transcript:
        recorder = IterationRecorder(setup.store, iteration_id, transcript, log, setup.redact)
        ctx = RunContext(
            max_turns=setup.night.max_turns,
            tool_names=tool_names,
            sink=lambda signal: recorder.signal(signal, setup.on_signal),
            context_window=setup.context_window,
            cancel=setup.cancel,
            budgets=setup.budgets,
            log=log,
            redact=setup.redact,
        )
        iteration = Iteration(setup, number, iteration_id, checkpoint, ctx, log, transcript)
        finish = Finisher(iteration)
        try:
            for message in messages:
                recorder.message(message)
            run = _agent_run(iteration, messages, recorder)
            return _judged(iteration, run, finish)
        except (Exception, KeyboardInterrupt) as failure:
            return _ended_by(failure, iteration, finish)


@dataclass(frozen=True)
class _AgentRun:
    """What the agent's run produced for the check to judge: its result and, when a guard stopped it after
    its own run_check passed, the guard's stop (the result then says it was not submitted)."""

    result: AgentResult
    stopped: QualityError | None = None


def _agent_run(iteration: Iteration, messages: list[Message], recorder: IterationRecorder) -> _AgentRun:
    """The agent's run, also when a guard stopped it after its own run_check passed; any other
    QualityError is raised."""
    setup, ctx = iteration.setup, iteration.ctx
    try:
        return _AgentRun(run_agent(setup.model, setup.toolbox, setup.guards, messages, ctx, recorder))
    except QualityError as stop:
        if not ctx.check_passed:
            raise
        # Stopped after its own run_check passed, nothing changed since (it never submitted, or
        # confirmed the pass once too often): the work is judged as a submission would be.
        result = AgentResult(f"(not submitted: {stop.message}; the check had passed)", ctx.answered, ctx.tokens)
        iteration.log.info("stopped_after_passing_check", reason=stop.reason)
        return _AgentRun(result, stopped=stop)


def _judged(iteration: Iteration, run: _AgentRun, finish: Finisher) -> IterationReport:
    """The end of an agent's `run` judged by the task's check: committed when it passes and the lease is still
    held, rolled back with a `check_failed` note when it fails. Raises Cancelled (the check died of the night's
    signal, or the lease is lost), the guard's stop when the check fails after it, and a commit's refusal."""
    setup, result = iteration.setup, run.result
    check = setup.workspace.run_check(
        setup.task.check, setup.night.check_timeout_s, cancel=setup.cancel, pass_env=setup.task.pass_env, redact=setup.redact
    )
    iteration.transcript.write("check", exit_code=check.exit_code, timed_out=check.timed_out, output=check.output[-CHECK_TAIL_CHARS:])
    if not check.passed and died_of_the_nights_signal(setup.cancel, check.exit_code):
        raise Cancelled(setup.cancel.why)
    if not check.passed and run.stopped is not None:
        raise run.stopped  # the guard's stop stands, as if the check had not been asked
    if not check.passed:
        iteration.ctx.report(Level.SEVERE, "check_failed", f"check failed: {_how_it_ended(check.exit_code)}")
        return finish.rolled_back(_check_failed(check.exit_code, check.output), result.turns, result.tokens)
    if setup.lease is not None and not setup.lease.still_held():
        raise Cancelled("lease_lost")  # another worker has the task now: its work, not ours, goes on the branch
    commit = _commit(iteration, result.summary)
    # The check passed on the checkpoint as it was: no commit is made, and none is named
    # (the checkpoint is an earlier night's commit, or the base).
    return finish.committed(commit if commit != iteration.checkpoint else "", result.turns, result.tokens)


# More than any summary a person reads in `git log`; far less than one argument of git's command line can carry.
_SUMMARY_CHARS = 8000


def _commit(iteration: Iteration, summary: str) -> str:
    """The work that passed its check committed onto the checkpoint, with the model's summary; the commit's
    hash (the checkpoint's when nothing changed). A refused commit is raised, a file too large reported first."""
    setup = iteration.setup
    # The model's summary, its control characters escaped: a NUL (which no command line can
    # carry) failed the commit of work that had passed its check, and an escape sequence
    # would redraw the terminal of whoever reads `git log` in the morning.
    # Redacted: the model may quote a secret value in it, and the branch goes where CI pushes it.
    # Shortened: a summary past one command line's argument (128 KiB on Linux) failed the commit as E2BIG.
    escaped_summary = shortened(visible(setup.redact(summary), keep="\n\t"), _SUMMARY_CHARS)
    message = f"overnight: {setup.task.name} iteration {iteration.number}\n\n{escaped_summary}".strip()
    try:
        return setup.workspace.commit(
            message, onto=iteration.checkpoint, max_file_bytes=setup.max_file_bytes, secrets=_passed_secrets(setup.task),
            on_kept_out=lambda kept: _log_kept_out(iteration.log, kept, setup.redact),
        )
    except QualityError as refused:
        if refused.reason == "file_too_large":  # the model's doing, as a guard's stop is: a severe signal
            iteration.ctx.report(Level.SEVERE, refused.reason, refused.message)
        raise


def _ended_by(failure: Exception | KeyboardInterrupt, iteration: Iteration, finish: Finisher) -> IterationReport:
    """The report of an iteration `failure` ended, rolled back with a note (a QualityError, or any other
    exception as `iteration_error`); ModelUnreachable, Cancelled, KeyboardInterrupt and StateError are raised
    again once the ending is recorded, and an exception of git killed by the night's signal as Cancelled."""
    setup, ctx = iteration.setup, iteration.ctx
    if isinstance(failure, QualityError):
        return finish.rolled_back(failure, ctx.answered, ctx.tokens)
    if isinstance(failure, ModelUnreachable):
        finish.unreachable(str(failure))
        raise failure
    if isinstance(failure, (Cancelled, KeyboardInterrupt)):
        finish.cancelled(getattr(failure, "why", "interrupted"))
        raise failure
    if isinstance(failure, StateError):
        # The state dir or the run store failed (disk full, read-only): the night ends with
        # that one line (exit 4), the worktree back at its checkpoint.
        finish.state_failed()
        raise failure
    # A bug or an environment failure: not the model's fault, but recorded.
    if died_of_the_nights_signal(setup.cancel, getattr(failure, "status", None)):  # git, killed with the night
        finish.cancelled(setup.cancel.why)
        raise Cancelled(setup.cancel.why) from None
    # An error's text may quote a secret (a filter's or a server's message, a URL with its password):
    # the traceback as structlog's `exception` field would carry it, and the note, through the night's redaction.
    iteration.log.error("iteration_error", exception=setup.redact(traceback.format_exc().rstrip("\n")))
    error = QualityError("iteration_error", "None: this was an error in overnight or its environment.", evidence=f"{type(failure).__name__}: {failure}")
    return finish.rolled_back(error, ctx.answered, ctx.tokens)


# The notes a prompt carries, at most, as a share of a known context window.
NOTES_SHARE_OF_WINDOW = 0.1


def first_messages(
    task: TaskConfig, night: NightConfig, tool_names: Sequence[str], notes: NotesBook, context_window: int | None = None
) -> list[Message]:
    """An iteration's prompt: how to work, the task, and the notes of its earlier iterations (no more of
    them than `notes_budget_chars`, nor than a tenth of a known window: a 4096-token one had a quarter
    of itself taken by notes before the first turn)."""
    budget = night.notes_budget_chars
    if context_window:
        budget = min(budget, window_chars(context_window, NOTES_SHARE_OF_WINDOW))
    return build_messages(task_prompt=task.prompt, check=task.check, tool_names=tool_names, notes=notes.for_prompt(task.name, budget))


def died_of_the_nights_signal(cancel: Any, status: object) -> bool:
    """Whether a process that died of SIGHUP, SIGINT or SIGTERM died of the signal that is stopping the night.

    systemd's control-group kill and Ctrl-C at a terminal signal the check and git as well as
    overnight, and they can die of it a moment before the night's own handler has set the token.
    """
    return cancel is not None and status in _SIGNAL_DEATHS and cancel.wait(SIGNAL_GRACE_S)


def _log_kept_out(log: Any, kept: KeptOutOfCommit, redact: Callable[[str], str]) -> None:
    """`secret_kept_out_of_commit`, each path through the night's redaction: a file may be named after the value."""
    log.warning("secret_kept_out_of_commit", paths=[redact(path) for path in kept.paths], names=list(kept.names))


def _passed_secrets(task: TaskConfig) -> PassedSecrets | None:
    """The values the task's check got through `pass_env`, which a commit keeps off the branch; None (nothing to
    look for: the agent's commands and every other check never get one) for a task without pass_env."""
    return passed_secrets(task.pass_env) if task.pass_env else None


def _how_it_ended(exit_code: int) -> str:
    """`exit N`, as the morning's reports have always said (`exit 127 (command not found)`), or `killed by signal N (NAME)`."""
    return how_it_ended(exit_code, exited="exit")


def _whole_lines_tail(output: str) -> str:
    """The output's last CHECK_TAIL_CHARS, from a line's start, marked as cut: a cut line's end alone (a stray `'`
    above a test's failure) read as if the check had printed it."""
    text = output.strip()
    if len(text) <= CHECK_TAIL_CHARS:
        return text
    tail = text[-CHECK_TAIL_CHARS:]
    kept = tail.partition("\n")[2] or tail
    return f"[... {len(text) - len(kept)} chars cut ...]\n{kept}"


def _check_failed(exit_code: int, output: str) -> QualityError:
    tail = _whole_lines_tail(output)
    return QualityError(
        "check_failed",
        "You submitted, but the check still fails. Run run_check, read its output, fix what it reports, "
        "and submit only after run_check passes.",
        evidence=f"{_how_it_ended(exit_code)}\n{tail}",
        message=f"check failed: {_how_it_ended(exit_code)}",
    )
