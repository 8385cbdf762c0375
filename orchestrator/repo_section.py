"""`[repo]`: the user's repository, the base its task branches start from, and what a rollback leaves alone."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from orchestrator.argument_limits import ARGUMENT_BYTES, COMMAND_LINE_BYTES, GIT_OWN_BYTES, environment_bytes
from orchestrator.config_section import Section


class RepoConfig(Section):
    """The user's repository: never touched; task worktrees branch from `base`."""

    path: Path = Path(".")
    base: str = "HEAD"
    keep: tuple[str, ...] = Field((), description="paths a rollback keeps, such as build caches")
    # A file the agent wrote larger than this is not committed (0: no limit): a dump, a log or a
    # dataset on the task's branch would go into the user's repository with its merge.
    max_file_mb: float = Field(20.0, ge=0, le=1_000_000)

    @field_validator("keep")
    @classmethod
    def _fits_a_git_argument(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Given to git as `--exclude=<pattern>`: a longer one stopped the first rollback mid-night (E2BIG, exit 4).
        # Counted in UTF-8: never shorter than in the locale's encoding, and unlike Latin-1 it encodes every pattern.
        for pattern in value:
            size = len(f"--exclude={pattern}".encode("utf-8", "surrogateescape"))
            if ARGUMENT_BYTES is not None and size >= ARGUMENT_BYTES:
                raise ValueError(f"a pattern of {len(pattern)} characters, more than one argument of git's command line can carry")
        # All of them go on one command line (`git clean -e <pattern>`: two arguments each, two pointers): patterns each
        # short enough, 2 MiB together, stopped the first rollback mid-night all the same (E2BIG, exit 4).
        together = sum(len(pattern.encode("utf-8", "surrogateescape")) + 20 for pattern in value)
        if COMMAND_LINE_BYTES is not None and together > (room := COMMAND_LINE_BYTES - environment_bytes() - GIT_OWN_BYTES):
            raise ValueError(
                f"{len(value)} patterns of {together} bytes together, more than one git command line can carry here with this "
                f"environment ({max(room, 0)}); keep a folder that holds them, not each path"
            )
        return value
