"""What an iteration leaves as it happens: each message, model call, tool call and signal written to its transcript, the
run store (also the iteration's heartbeat) and the log, through the night's redaction."""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.protocols import Message, SignalSink
from orchestrator.records import ModelResponse, Signal, ToolCall, ToolResult
from orchestrator.surrogates import strings_mapped
from orchestrator.transcript import Transcript


class IterationRecorder:
    """Implements agent.Recorder: store events, transcript lines, log events, heartbeat.

    What the model wrote (its text, its calls' arguments) and the prompt (the task's may quote a value) are recorded
    through the night's redaction: a secret value the model read before or guessed stays out of the records. The loop's
    own messages and calls, which the model and the tools get, stay as they are. A tool's output is redacted when made."""

    def __init__(self, store: Any, iteration_id: int, transcript: Transcript, log: Any, redact: Callable[[str], str] = str) -> None:
        self.store = store
        self.iteration_id = iteration_id
        self.transcript = transcript
        self.log = log
        self.redact = redact

    def message(self, message: Message) -> None:
        # A tool's answer is its output, redacted when the tool made it: walked again, it would cost a pass over up to
        # max_output_chars for each secret value, on every call (half the redaction's cost here).
        recorded = message if message.get("role") == "tool" else strings_mapped(message, self.redact)
        self.transcript.write("message", message=recorded)

    def model_call(self, response: ModelResponse) -> None:
        latency_ms = int(response.latency_s * 1000)
        self.store.record_model_call(
            self.iteration_id,
            prompt_tokens=response.prompt_tokens,
            completion_tokens=response.completion_tokens,
            latency_ms=latency_ms,
            finish_reason=response.finish_reason,
        )  # also the iteration's heartbeat, in the same transaction
        self.transcript.write(
            "model_call",
            text=self.redact(response.text),
            reasoning=self.redact(response.reasoning),
            tool_calls=[{"name": self.redact(c.name), "arguments": self.redact(c.arguments)} for c in response.tool_calls],
            prompt_tokens=response.prompt_tokens,
            completion_tokens=response.completion_tokens,
            latency_ms=latency_ms,
            finish_reason=response.finish_reason,
        )
        self.log.debug("model_call", tokens=response.tokens, latency_ms=latency_ms, calls=len(response.tool_calls))

    def tool_call(self, call: ToolCall, result: ToolResult) -> None:
        arguments = strings_mapped(call.arguments, self.redact)
        self.store.record_tool_call(self.iteration_id, name=call.name, ok=result.ok, message=result.output[:500], data={"arguments": arguments})
        self.transcript.write("tool_call", name=call.name, arguments=arguments, source=call.source, ok=result.ok, output=result.output)
        self.log.debug("tool_call", tool=call.name, ok=result.ok)

    def signal(self, signal: Signal, forward: SignalSink) -> None:
        self.store.record_signal(self.iteration_id, level=signal.level.value, kind=signal.kind, message=signal.message)
        self.transcript.write("signal", **signal.as_dict())
        # `level` is the signal's (logs._add_log_level keeps it): warning or severe, as in the report.
        self.log.warning("signal", level=signal.level.value, kind=signal.kind, message=signal.message)
        forward(signal)
