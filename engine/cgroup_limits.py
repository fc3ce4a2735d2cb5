"""The memory limit and CPU quota this process's cgroups set (v1 and v2): what a container may use, which
/proc/meminfo and the CPU affinity do not show (they show the host).

Each is read on the process's own cgroup (/proc/self/cgroup) and every parent up to its hierarchy's root; the lowest
wins. A container shown its own cgroup at the mount's root (no cgroup namespace: /proc/self/cgroup still names the
host's path, e.g. /docker/ID) is found by trying that path's tails under the mount, then the mount itself.
Everything is read under `ROOT` (or a `root` argument), so tests build fake trees.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["ROOT", "memory_limit", "cpu_quota", "cpu_limit"]

ROOT = "/"  # where /proc and /sys are read from
V1_UNLIMITED = 1 << 62  # v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712)
_T = TypeVar("_T")


def memory_limit(root: str | None = None) -> int | None:
    """The lowest memory limit in bytes on this process's cgroups (v2 memory.max, v1 memory.limit_in_bytes), or None
    where none is set or none can be read. Raises nothing."""
    limits = [*_each(root, "", "memory.max", _v2_memory), *_each(root, "memory", "memory.limit_in_bytes", _v1_memory)]
    return min(limits) if limits else None


def cpu_quota(root: str | None = None) -> float | None:
    """The lowest CPU quota on this process's cgroups in CPUs (quota / period: v2 cpu.max, v1 cpu.cfs_quota_us over
    cpu.cfs_period_us), or None where none is set or none can be read. Raises nothing."""
    quotas = [*_each(root, "", "cpu.max", _v2_cpu), *_each(root, "cpu", "cpu.cfs_quota_us", _v1_cpu)]
    return min(quotas) if quotas else None


def cpu_limit(root: str | None = None) -> int | None:
    """The CPU quota as whole CPUs (rounded up, at least 1), or None without one. Raises nothing."""
    quota = cpu_quota(root)
    return None if quota is None else max(1, math.ceil(quota - 1e-9))


def _each(root: str | None, controller: str, name: str, parse: Callable[[str], _T | None]) -> Iterator[_T]:
    """`parse(path of NAME)` over the process's cgroup and its parents in one hierarchy (controller "": v2's), the
    values it gives only (None: no limit there; unreadable or malformed files count as none)."""
    root = root or ROOT
    for mount, path in _hierarchies(root, os.path.normpath(os.path.join(root, "sys", "fs", "cgroup")), controller):
        here = _own_dir(mount, path)
        while True:
            try:
                value = parse(os.path.join(here, name))
            except (OSError, ValueError):
                value = None
            if value is not None:
                yield value
            if here == mount:
                break
            here = os.path.dirname(here)


def _hierarchies(root: str, base: str, controller: str) -> list[tuple[str, str]]:
    """(mount directory, the process's path in it) for the v2 hierarchy (controller "") or v1's `controller`. Where
    /proc/self/cgroup cannot be read, the mount's root stands for the process's cgroup."""
    try:
        with open(os.path.join(root, "proc", "self", "cgroup")) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        lines = [["0", controller, "/"]]
    found = []
    for fields in lines:
        if len(fields) != 3:
            continue
        controllers, path = fields[1], fields[2]
        if not controller and not controllers:  # v2: pure (/sys/fs/cgroup) or hybrid (/sys/fs/cgroup/unified)
            mounts = [base, os.path.join(base, "unified")]
            found += [(m, path) for m in mounts if os.path.exists(os.path.join(m, "cgroup.controllers"))]
        elif controller and controller in controllers.split(","):  # v1: "cpu,cpuacct" is often linked as "cpu" too
            mounts = [m for m in (os.path.join(base, controllers), os.path.join(base, controller)) if os.path.isdir(m)]
            found += [(mounts[0], path)] if mounts else []
    return found


def _own_dir(mount: str, path: str) -> str:
    """The process's cgroup directory under `mount`: the whole path, else its longest tail that exists, else the
    mount itself."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for start in range(len(parts)):
        here = os.path.join(mount, *parts[start:])
        if os.path.isdir(here):
            return here
    return mount


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _v2_memory(path: str) -> int | None:
    text = _read(path)
    return None if text == "max" else int(text)


def _v1_memory(path: str) -> int | None:
    value = int(_read(path))
    return value if 0 <= value < V1_UNLIMITED else None


def _v2_cpu(path: str) -> float | None:
    quota, period = (_read(path).split() + ["100000"])[:2]
    return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)


def _v1_cpu(path: str) -> float | None:
    quota = int(_read(path))
    period = int(_read(os.path.join(os.path.dirname(path), "cpu.cfs_period_us")))
    return quota / period if quota > 0 and period > 0 else None
