"""How a command ended, in the words the check's notes, the tools and the morning's reports use."""

from __future__ import annotations

import signal


def how_it_ended(exit_code: int, exited: str = "exit code") -> str:
    """`exit code N`, or for a command a signal killed (Popen's -N; bash execs a lone command, so nothing printed
    "Segmentation fault"), `killed by signal N (SIGNAME)`. The shell's own two codes are named, `exit code 127 (command
    not found)`: a missing script read as any failing test, though no change to the code mends it. `exited`: the words
    before N (the morning's reports say `exit N`)."""
    if exit_code >= 0:
        named = _SHELLS_OWN_CODES.get(exit_code)
        return f"{exited} {exit_code}" + (f" ({named})" if named else "")
    name = signal_name(-exit_code)
    return f"killed by signal {-exit_code}" + (f" ({name})" if name else "")


def signal_name(number: int) -> str | None:
    """`SIGKILL` for 9; None for a number this platform names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


# What bash exits with when it could not run the command at all (its manual, "Exit Status").
_SHELLS_OWN_CODES = {126: "the command is not executable", 127: "command not found"}
