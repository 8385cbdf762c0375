"""How many threads the embedded model's server is given: the CPUs this process may really keep busy (its
affinity, a container's or a service's cgroup quota), not the host's count, which a quota throttles."""

from __future__ import annotations

import math
import os
from pathlib import Path

from orchestrator.errors import ConfigError

# An override for people who know their machine; the config has no key for it.
THREADS_ENV = "OVERNIGHT_LOCAL_THREADS"
# llama-server reads its thread count as a C int; more threads than this is no machine's.
MAX_THREADS = 1024


# Where Linux shows the cgroups: the groups' folders, and the groups this process is in (one line a
# hierarchy, "0::/system.slice/x.service" for cgroup v2's, "4:cpu,cpuacct:/docker/ID" for v1's cpu).
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT, own_cgroups: Path = OWN_CGROUPS) -> int:
    """The CPUs this process may keep busy: those its affinity allows (`taskset`, a container's cpuset), fewer
    where a cgroup quota (`docker --cpus`, systemd's CPUQuota=) allows less time, rounded up. At least 1.
    (os.cpu_count() is the host's: in a container given 2 CPUs on a 64-core host it gave llama-server 4
    threads, which the quota throttles.)"""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min([allowed, *_cgroup_cpu_quotas(cgroup_root, own_cgroups)]))


def _cgroup_cpu_quotas(root: Path, own_cgroups: Path) -> list[int]:
    """The CPUs' worth of time each quota over this process allows: its own group's and every group's above
    it, cgroup v2's `cpu.max` ("QUOTA PERIOD") and v1's `cpu.cfs_quota_us` over `cpu.cfs_period_us`.
    A container sees its own group at the root; a service on a host (CPUQuota=) only in its group's folder."""
    v2_group, v1_group = _own_cgroup_paths(own_cgroups)
    quotas = [_cpu_quota(_cgroup_file_text(folder / "cpu.max")) for folder in _folders_up(root, v2_group)]
    quotas += [
        _cpu_quota(f"{_cgroup_file_text(folder / 'cpu.cfs_quota_us')} {_cgroup_file_text(folder / 'cpu.cfs_period_us')}")
        for folder in _folders_up(root / "cpu", v1_group)
    ]
    return [quota for quota in quotas if quota is not None]


def _own_cgroup_paths(own_cgroups: Path) -> tuple[str, str]:
    """This process's cgroup v2 group and its v1 cpu group, as paths below their roots ("/" when unknown)."""
    v2, v1 = "/", "/"
    for line in _cgroup_file_text(own_cgroups).splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _folders_up(root: Path, group: str) -> list[Path]:
    """`group`'s folder below `root` and each folder above it up to `root`. A group outside this cgroup namespace
    ("/../..") has no folder here: only `root`'s, the namespace's own group."""
    parts = [part for part in group.split("/") if part]
    if ".." in parts:
        parts = []
    return [root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _cgroup_file_text(path: Path) -> str:
    """`path`'s text; "" where it cannot be read (no such cgroup, no cgroups at all: macOS)."""
    try:
        return path.read_text(encoding="ascii")
    except (OSError, ValueError):
        return ""


def _cpu_quota(quota_and_period: str) -> int | None:
    """The CPUs' worth of time "QUOTA PERIOD" allows, rounded up; None where it sets no limit ("max", v1's -1)
    or says something else."""
    try:
        quota, period = (int(number) for number in quota_and_period.split())
    except ValueError:  # "max" is no number; an empty or foreign file is no limit we know
        return None
    return math.ceil(quota / period) if quota > 0 and period > 0 else None


def default_threads() -> int:
    """Half the usable cores, 1 to 4 (on a busy 2-core machine one thread was the steadier choice), or
    $OVERNIGHT_LOCAL_THREADS; ConfigError (exit 2) when that is set (not empty) to anything but a whole
    number from 1 to MAX_THREADS."""
    override = os.environ.get(THREADS_ENV, "").strip()
    if not override:
        return max(1, min(4, usable_cpus() // 2))
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses; and no more of them than the
    # largest count has (leading zeros aside): int() refuses more than 4300, a traceback.
    digits = override.lstrip("0")
    if not (override.isascii() and override.isdigit() and len(digits) <= len(str(MAX_THREADS)) and 0 < int(override) <= MAX_THREADS):
        raise ConfigError(
            f"{THREADS_ENV}: {override!r} is not a whole number of threads from 1 to {MAX_THREADS} (unset it for the default)"
        )
    return int(override)
