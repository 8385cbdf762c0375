"""The guards that watch an agent run, one small file each, and how to build the set.

A guard is a plain object with optional hooks (see orchestrator.protocols.Guard).
User guards come from `[guards] custom = ["module:Class"]` or from packages that
register an entry point in the group "overnight.guards".
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable

from orchestrator.config import GuardsConfig
from orchestrator.errors import ConfigError

from guards.broken_call import BrokenCallGuard
from guards.context import ContextGuard
from guards.dead_loop import DeadLoopGuard
from guards.empty_response import EmptyResponseGuard
from guards.failing_streak import FailingStreakGuard
from guards.no_tool_call import NoToolCallGuard
from guards.repeated_call import RepeatedCallGuard
from guards.unknown_tool import UnknownToolGuard
from guards.unusable_answers import UnusableAnswersGuard

ENTRY_POINT_GROUP = "overnight.guards"
HOOKS = ("before_run", "after_model_response", "after_tool_call")

__all__ = [
    "BrokenCallGuard",
    "ContextGuard",
    "DeadLoopGuard",
    "EmptyResponseGuard",
    "FailingStreakGuard",
    "NoToolCallGuard",
    "RepeatedCallGuard",
    "UnknownToolGuard",
    "UnusableAnswersGuard",
    "build_guards",
    "guard_factory",
    "default_guards",
    "load_guard",
    "user_guards",
]


def default_guards(config: GuardsConfig) -> list[Any]:
    """The built-in guards with the thresholds from `[guards]`."""
    # Order matters only when two would act on the same event: a stop comes before a reminder.
    return [
        ContextGuard(warn_ratio=config.context_warn_ratio),
        EmptyResponseGuard(stop_at=config.empty_stop_at),
        NoToolCallGuard(stop_at=config.no_tool_call_stop_at, many_calls_at=config.many_calls_warn_at),
        UnknownToolGuard(stop_at=config.unknown_tool_stop_at),
        BrokenCallGuard(stop_at=config.broken_stop_at),
        # After the four above: answers all of one kind stop there first, with their own words.
        UnusableAnswersGuard(stop_at=config.no_tool_call_stop_at),
        RepeatedCallGuard(
            remind_at=config.repeat_remind_at,
            stop_at=config.repeat_stop_at,
            progress_tools=config.progress_tools,
        ),
        FailingStreakGuard(at=config.failing_streak_at, stop_at=config.failing_streak_stop_at, progress_tools=config.progress_tools),
        DeadLoopGuard(
            window=config.dead_loop_window,
            recent=config.dead_loop_recent,
            distinct=config.dead_loop_distinct,
            progress_tools=config.progress_tools,
        ),
    ]


def load_guard(spec: str) -> Any:
    """Import "module:Class" and instantiate it with no arguments; ConfigError names the key."""
    return _instantiate(_load_target(spec), f"[guards] custom: {spec!r}")


def _load_target(spec: str) -> Any:
    where = f"[guards] custom: {spec!r}"
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name.strip() or not attribute.strip():
        raise ConfigError(f'{where} is not of the form "module:Class"')
    try:
        module = importlib.import_module(module_name.strip())
    except Exception as exc:  # any import-time failure is the user's config to fix
        raise ConfigError(f"{where}: cannot import {module_name.strip()!r} ({type(exc).__name__}: {exc})") from None
    target: Any = module
    for part in attribute.strip().split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{where}: module {module_name.strip()!r} has no {attribute.strip()!r}")
    return target


def user_guards(config: GuardsConfig) -> list[Any]:
    """Guards named in `[guards] custom`, then those registered as entry points."""
    return [_instantiate(target, where) for target, where in _user_guard_targets(config)]


def build_guards(config: GuardsConfig) -> list[Any]:
    """Every guard of a run: the built-in ones, then the user's."""
    return default_guards(config) + user_guards(config)


def guard_factory(config: GuardsConfig) -> Callable[[], list[Any]]:
    """Find the user's guards once (imports, the entry-point scan); then make a fresh set per task.

    Raises ConfigError now, before the night starts, for a guard that cannot be loaded or made.
    """
    targets = _user_guard_targets(config)

    def build() -> list[Any]:
        return default_guards(config) + [_instantiate(target, where) for target, where in targets]

    build()
    return build


def _user_guard_targets(config: GuardsConfig) -> list[tuple[Any, str]]:
    targets = [(_load_target(spec), f"[guards] custom: {spec!r}") for spec in config.custom]
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {entry.name!r} ({entry.value}) in group {ENTRY_POINT_GROUP}"
        try:
            targets.append((entry.load(), where))
        except Exception as exc:
            raise ConfigError(f"{where}: cannot load ({type(exc).__name__}: {exc})") from None
    return targets


def _instantiate(target: Any, where: str) -> Any:
    if isinstance(target, type):
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"{where}: cannot create it with no arguments ({type(exc).__name__}: {exc})") from None
    if not any(callable(getattr(target, hook, None)) for hook in HOOKS):
        raise ConfigError(f"{where}: has none of the hooks {', '.join(HOOKS)}")
    return target
