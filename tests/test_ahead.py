"""A task's first request, asked ahead: against a real HTTP server, and in a real night."""

from __future__ import annotations

import gc
import socket
import threading
import time
import warnings

import pytest

from orchestrator import worktree_registration
from orchestrator.ahead import AskedAhead
from orchestrator.cancel import CancelToken
from orchestrator.config import ModelConfig
from orchestrator.errors import ModelUnreachable
from orchestrator.fake_server import ScriptedServer
from orchestrator.model import EndpointModel
from orchestrator.scripted import Reply, call, say
from tests.conftest import git
from tests.test_night import FIX, overnight

MESSAGES = [{"role": "system", "content": "work"}, {"role": "user", "content": "Task: fix it"}]
TOOLS: list[dict] = []


def model_for(url: str) -> EndpointModel:
    return EndpointModel(ModelConfig(name="openai/scripted", api_base=url, request_timeout_s=10, retries=0), cancel=CancelToken())


def wait_for(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_the_request_leaves_at_once_and_its_answer_is_the_first_turns() -> None:
    with ScriptedServer([say("first"), say("second")]) as server:
        model = model_for(server.url)
        ahead = AskedAhead(model, MESSAGES, TOOLS)
        assert wait_for(lambda: len(server.requests) == 1), "the request did not leave before anyone asked"
        assert ahead.complete(list(MESSAGES), TOOLS).text == "first"
        assert ahead.complete(list(MESSAGES), TOOLS).text == "second"  # once only: then the model itself
        assert len(server.requests) == 2
        model.close()


def test_a_different_first_request_goes_to_the_model() -> None:
    """A guard's reminder before the first turn changes the request: the answer asked ahead is not used."""
    with ScriptedServer([say("asked ahead"), say("asked now")]) as server:
        model = model_for(server.url)
        ahead = AskedAhead(model, MESSAGES, TOOLS)
        assert wait_for(lambda: len(server.requests) == 1)
        changed = [*MESSAGES, {"role": "user", "content": "Reminder: call one tool at a time."}]
        assert ahead.complete(changed, TOOLS).text == "asked now"
        assert server.requests[1]["messages"][-1]["content"].startswith("Reminder")
        model.close()


def test_an_answer_nobody_takes_is_handed_on_when_it_arrives() -> None:
    """Dropped, or passed over for another first request, the answer still cost the server its tokens:
    they go to `unused` (the night counts them against its budget)."""
    dropped = say("dropped", delay_s=0.3, prompt_tokens=100, completion_tokens=5)
    passed_over = say("passed over", delay_s=0.3, prompt_tokens=200, completion_tokens=7)
    with ScriptedServer([dropped, passed_over, say("asked now")]) as server:
        model = model_for(server.url)
        unused: list[int] = []
        with AskedAhead(model, MESSAGES, TOOLS, unused=unused.append):
            pass  # the task ended before its first turn
        assert unused == [] and wait_for(lambda: unused == [105])
        ahead = AskedAhead(model, MESSAGES, TOOLS, unused=unused.append)
        assert wait_for(lambda: len(server.requests) == 2)
        changed = [*MESSAGES, {"role": "user", "content": "Reminder: call one tool at a time."}]
        assert ahead.complete(changed, TOOLS).text == "asked now"
        assert wait_for(lambda: unused == [105, 207])
        model.close()


def test_an_answer_cut_off_that_nobody_takes_is_counted_too() -> None:
    """A first answer stopped as runaway output (a small model looping) cost the server more than most:
    only answers that ended well were handed on, and max_tokens_per_night was passed unseen."""
    with ScriptedServer([Reply(text="Let me check. ", endless="I will read the file again. ")]) as server:
        model = model_for(server.url)
        unused: list[int] = []
        with AskedAhead(model, MESSAGES, TOOLS, unused=unused.append):
            pass
        assert wait_for(lambda: len(unused) == 1) and unused[0] > 0, unused
        model.close()


@pytest.mark.parametrize("transport", ["direct", "litellm"])
def test_an_answer_a_cancel_cuts_off_that_nobody_takes_is_counted_too(transport) -> None:
    """SIGTERM or the deadline cut a first answer mid-stream after its task had ended without it: what it had
    written went uncounted (first_answer_unused only for an answer that ended, or ran away, or went silent)."""
    streaming = say(" ".join(f"word{n}" for n in range(3000)), chunk_interval_s=0.01)
    with ScriptedServer([streaming]) as server:
        cancel = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport=transport)
        model = EndpointModel(config, cancel=cancel)
        unused: list[int] = []
        with AskedAhead(model, MESSAGES, TOOLS, unused=unused.append):
            assert wait_for(lambda: len(server.requests) == 1)
            time.sleep(0.5)  # some hundreds of characters written
        cancel.cancel("SIGTERM")
        assert wait_for(lambda: len(unused) == 1) and unused[0] > 50, unused
        model.close()


def test_an_answer_the_nights_cancel_cuts_off_is_counted_before_its_task_ends() -> None:
    """A task ended by SIGTERM while its first answer was being cut: the answer was handed on after the night had
    ended (litellm's watcher cuts it up to 0.1 s later), as the process exited: logged, missing from the report."""
    streaming = say(" ".join(f"word{n}" for n in range(3000)), chunk_interval_s=0.01)
    with ScriptedServer([streaming]) as server:
        cancel = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport="litellm")
        model = EndpointModel(config, cancel=cancel)
        unused: list[int] = []
        with AskedAhead(model, MESSAGES, TOOLS, unused=unused.append, cancel=cancel):
            assert wait_for(lambda: len(server.requests) == 1)
            time.sleep(0.5)  # some hundreds of characters written
            cancel.cancel("SIGTERM")
        assert len(unused) == 1 and unused[0] > 50, unused
        model.close()


def test_the_first_requests_failure_reaches_the_first_turn() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    model = model_for(url)
    ahead = AskedAhead(model, MESSAGES, TOOLS)
    with pytest.raises(ModelUnreachable):
        ahead.complete(MESSAGES, TOOLS)
    model.close()


def test_a_dropped_answer_is_not_waited_for() -> None:
    """A task that ends before its first turn leaves the slow call behind instead of waiting for it."""
    with ScriptedServer([call("submit", {"summary": "late"}, delay_s=5), say("now")]) as server:
        model = model_for(server.url)
        with AskedAhead(model, MESSAGES, TOOLS) as ahead:
            assert wait_for(lambda: len(server.requests) == 1)
            started = time.monotonic()
        assert time.monotonic() - started < 1
        assert ahead.complete(MESSAGES, TOOLS).text == "now"
        model.close()


def test_a_tasks_first_request_leaves_while_its_worktree_cannot_be_made(config_file, server, repo) -> None:
    """Worktrees cannot be registered until the first request has reached the server; the night goes on as always."""
    config = config_file()
    server.enqueue(*FIX)
    seen: list[bool] = []
    holding = threading.Event()

    def hold_worktrees_back() -> None:
        with worktree_registration._REGISTER_LOCK:
            holding.set()
            seen.append(wait_for(lambda: len(server.requests) >= 1))
            seen.append((config.parent / "state" / "worktrees" / "fix-greet").exists())

    holder = threading.Thread(target=hold_worktrees_back)
    holder.start()
    holding.wait(5)
    assert overnight("run", "--config", str(config)) == 0
    holder.join(timeout=30)
    assert seen == [True, False], "the first request waited for the worktree"
    assert len(server.requests) == len(FIX)
    assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")


def an_answer_nobody_took_on_a_tasks_own_model(server: ScriptedServer, transport: str, first_turn: list[dict] | None = None) -> list[int]:
    """The tokens handed on; the models and tokens are left for the collector once it returns. `first_turn`: the
    task's first request, another than the one asked ahead (by default the task ends before its first turn)."""
    cancel = CancelToken()
    config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport=transport)
    night_model = EndpointModel(config, cancel=cancel)
    unused: list[int] = []
    with AskedAhead(night_model.for_task(cancel.child()), MESSAGES, TOOLS, unused=unused.append, own_model=True) as model:
        if first_turn is not None:  # answered at once, while the answer asked ahead still streams
            assert wait_for(lambda: len(server.requests) == 1)
            assert model.complete(first_turn, TOOLS).text == "asked now"
    wait_for(lambda: len(unused) == 1, timeout_s=60)  # a first call imports litellm (context_window): seconds on a busy host
    time.sleep(0.2)  # the call's thread ends
    night_model.close()
    return unused


@pytest.mark.parametrize("transport", ["direct", "litellm"])
def test_a_tasks_own_model_is_closed_after_the_answer_nobody_took(transport) -> None:
    """A task's own model (EndpointModel.for_task) was closed as its task ended, while the first answer nobody took
    still streamed: its connection then went back to the closed pool, left open (`ResourceWarning: unclosed
    <socket>`, a plain line among a night's JSON logs); through litellm, it closed the clients that answer streamed on."""
    streaming = say(" ".join(f"word{n}" for n in range(300)), chunk_interval_s=0.002)
    with ScriptedServer([streaming]) as server, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        unused = an_answer_nobody_took_on_a_tasks_own_model(server, transport)
        gc.collect()
    assert len(unused) == 1 and unused[0] > 300, unused  # read whole, not cut by the close
    assert [str(warning.message) for warning in seen if issubclass(warning.category, ResourceWarning)] == []


@pytest.mark.parametrize("transport", ["direct", "litellm"])
def test_a_tasks_own_model_is_closed_after_the_answer_its_other_first_request_dropped(transport) -> None:
    """A first turn whose request was another (a guard's reminder) dropped the answer asked ahead, and the task's own
    model was closed at its end while that answer still streamed: its connection left open (`ResourceWarning`);
    through litellm the clients it streamed on closed, the answer cut and its tokens never counted."""
    streaming = say(" ".join(f"word{n}" for n in range(300)), chunk_interval_s=0.004)
    reminded = [*MESSAGES, {"role": "user", "content": "Reminder: call one tool at a time."}]
    with ScriptedServer([streaming, say("asked now")]) as server, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        unused = an_answer_nobody_took_on_a_tasks_own_model(server, transport, first_turn=reminded)
        gc.collect()
    assert len(unused) == 1 and unused[0] > 300, unused  # read whole, not cut by the close
    assert [str(warning.message) for warning in seen if issubclass(warning.category, ResourceWarning)] == []


@pytest.mark.parametrize("base_handler_flag", [None, "1"])  # "1" is not litellm's "true": its openai route is unchanged
def test_tasks_first_calls_at_once_through_litellm_leave_no_connection_open(
    base_handler_flag: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four tasks' first calls through litellm at once, each answered 503, leave no connection open once their models
    are closed: litellm's process-wide client cache, filled without a lock, kept one of the four clients those calls
    made, and the others' kept-alive sockets were left to the collector (`ResourceWarning: unclosed <socket>`)."""
    if base_handler_flag is not None:
        monkeypatch.setenv("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER", base_handler_flag)
    with ScriptedServer([Reply(status=503)] * 4) as server, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport="litellm")
        night_model = EndpointModel(config, cancel=CancelToken())
        task_models = [night_model.for_task(CancelToken()) for _ in range(4)]
        all_ready = threading.Barrier(4)
        failures: list[str] = []  # not the errors: their causes hold the clients, kept from the collector

        def first_call(model: EndpointModel) -> None:
            all_ready.wait()
            try:
                model.complete(MESSAGES, TOOLS)
            except ModelUnreachable as failure:
                failures.append(str(failure))

        threads = [threading.Thread(target=first_call, args=(model,)) for model in task_models]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for model in [*task_models, night_model]:
            model.close()
        del task_models, night_model, threads
        gc.collect()
    assert len(failures) == 4, failures
    assert [str(warning.message) for warning in seen if issubclass(warning.category, ResourceWarning)] == []
