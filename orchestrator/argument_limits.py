"""How much one argument and one command line may carry on this host: a config whose check or `keep` patterns are
longer is refused when it loads, not when its first command fails to start mid-night."""

from __future__ import annotations

import os
import sys

# Linux passes no argument longer than 32 pages, its closing NUL included (MAX_ARG_STRLEN, 128 KiB): a longer check,
# given to bash whole, failed to start in every iteration (E2BIG, an iteration_error's traceback, the task failed).
ARGUMENT_BYTES = 32 * os.sysconf("SC_PAGE_SIZE") if sys.platform.startswith("linux") else None
# And no command line longer, its arguments and environment together (ARG_MAX: a quarter of the stack's limit, 2 MiB by
# default, the C library's sysconf says it as the kernel counts it), each argument and variable also a pointer (8 bytes).
COMMAND_LINE_BYTES = os.sysconf("SC_ARG_MAX") if sys.platform.startswith("linux") else None
# What a git command overnight runs holds besides the `keep` patterns: its own arguments, the worktree's settings.
GIT_OWN_BYTES = 16 * 1024


def environment_bytes() -> int:
    """What this process's environment takes of a command line it starts: each variable, its NUL and its pointer."""
    return sum(len(name) + len(value) + 2 + 8 for name, value in os.environb.items())
