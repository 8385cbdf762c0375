"""A task's first model request leaves before its worktree is ready.

The request needs only the prompt (the task, its notes, the tool list). The
worktree (a checkout that takes seconds in a large repository on a task's
first night) and the run store's rows are made while the model reads it.
Nothing acts on the answer earlier than before: the agent loop receives it
as the answer to its first turn, after the checkpoint is taken and recorded.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, Sequence

from orchestrator.errors import Cancelled, QualityError
from orchestrator.protocols import Message, Model
from orchestrator.records import ModelResponse

# A call the task's cancel cut ends within the watcher's poll and its cut grace (watchdog.py: 0.1 s + 1 s).
_CUT_CALL_ENDS_S = 1.5


class AskedAhead:
    """Implements protocols.Model: `model`, with its answer to one request asked for at construction.

    A `complete` with exactly that request gets that answer (or its exception:
    watchdog, unreachable, cancelled), once. Any other request goes to `model`,
    and so does everything after the first call. The request runs in a daemon
    thread, so an answer nobody takes never holds up the end of the process.
    """

    def __init__(
        self,
        model: Model,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        unused: Callable[[int], None] | None = None,
        cancel: Any = None,
        own_model: bool = False,
    ) -> None:
        """`unused`: given the tokens of the answer nobody took, when it arrives (the server spent them all
        the same), an answer cut off as it came (runaway output, silence, the deadline, a signal, a lost lease) included.
        `cancel`: the task's CancelToken (cancelled with the night's), which cuts the call.
        `own_model`: `model` is the task's own (EndpointModel.for_task), closed on the way out, or once the first
        request's call has ended if that is later."""
        self._model = model
        self._own_model = own_model
        self._request = (list(messages), list(tools))
        self._unused = unused
        self._cancel = cancel
        self._answer: Future[ModelResponse] | None = Future()
        # The first request's call, taken or not: the task's own model is closed once it has ended.
        self._first_call = self._answer
        if own_model and cancel is not None:
            # The task's token (a child of the night's) keeps hearing the night's until that call ends: it may
            # outlive the task, and a signal or the deadline still cuts it.
            cancel.hold()
        threading.Thread(target=self._ask, args=(self._answer,), name="first-request", daemon=True).start()

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        if self._answer is not None and (list(messages), list(tools)) == self._request:
            answer, self._answer = self._answer, None
            return answer.result()
        self.drop()  # another first request (a guard reminded before it): this one's answer is not taken
        return self._model.complete(messages, tools)

    def drop(self) -> None:
        """Nobody will take the answer (the task ended before its first turn); the call finishes unseen,
        but not uncounted: its answer goes to `unused`."""
        answer, self._answer = self._answer, None
        if answer is not None and self._unused is not None:
            answer.add_done_callback(self._hand_unused)

    def _hand_unused(self, answer: Future[ModelResponse]) -> None:
        if self._unused is None:
            return
        error = answer.exception()
        if error is None:
            self._unused(answer.result().tokens)
        elif isinstance(error, (QualityError, Cancelled)) and error.tokens:  # cut off: what it read and wrote was spent
            self._unused(error.tokens)

    def __enter__(self) -> "AskedAhead":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._answer is not None and self._cancel is not None and self._cancel.cancelled:
            # Cut, it ends in moments: counted here, before the task's end and the night's. Handed on after them, it
            # raced the process's exit: logged as first_answer_unused, but missing from the store and so the report.
            wait([self._answer], timeout=_CUT_CALL_ENDS_S)
        self.drop()
        if self._own_model:
            # At once if the first call has ended, else when it does: closed under an answer nobody took (the task ended
            # before its first turn, or its first request was another), that call's connection went back to a closed
            # pool and stayed open, and through litellm the clients it streamed on were closed, the answer cut.
            self._first_call.add_done_callback(self._closed)

    def _closed(self, _call: Future[ModelResponse]) -> None:
        self._model.close()
        if self._cancel is not None:
            self._cancel.release()

    def _ask(self, answer: Future[ModelResponse]) -> None:
        try:
            answer.set_result(self._model.complete(*self._request))
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever takes the answer
            answer.set_exception(exc)
