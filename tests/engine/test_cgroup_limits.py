"""engine.cgroup_limits: a container's memory limit and CPU quota from its own cgroup and its parents, in cgroup v1
and v2, on fake /proc/self/cgroup + /sys/fs/cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

from engine.cgroup_limits import cpu_limit, cpu_quota, memory_limit

GIB = 1 << 30
V1_NO_LIMIT = "9223372036854771712"  # what v1 shows where no limit is set


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Files under `root`, named relative to it ("sys/fs/cgroup/...")."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def v1_tree(root: Path, memory: int = 2 * GIB, quota: int = 100000) -> Path:
    """This host's layout: cgroup v1 for memory and cpu (cpu,cpuacct, linked as cpu), a v2 hierarchy under unified
    with neither controller, the process in /process_api/abc; the limits on its own cgroup only."""
    write_tree(root, {
        "proc/self/cgroup": "5:memory:/process_api/abc\n2:cpu,cpuacct:/process_api/abc\n1:name=systemd:/\n0::/\n",
        "sys/fs/cgroup/unified/cgroup.controllers": "",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NO_LIMIT,
        "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": V1_NO_LIMIT,
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": str(memory),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
        "sys/fs/cgroup/cpu,cpuacct/process_api/abc/cpu.cfs_quota_us": str(quota),
        "sys/fs/cgroup/cpu,cpuacct/process_api/abc/cpu.cfs_period_us": "100000",
    })
    os.symlink("cpu,cpuacct", root / "sys/fs/cgroup/cpu")
    return root


def test_v1_limits_on_the_process_own_cgroup(tmp_path) -> None:
    # The probe's host: a 2 GiB limit and a 1-CPU quota, neither at the mount's root.
    root = str(v1_tree(tmp_path))
    assert memory_limit(root) == 2 * GIB
    assert cpu_quota(root) == 1.0 and cpu_limit(root) == 1


def test_v1_a_parent_limit_lower_than_the_own_wins(tmp_path) -> None:
    root = v1_tree(tmp_path, memory=4 * GIB, quota=-1)
    write_tree(root, {"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": str(GIB),
                      "sys/fs/cgroup/cpu,cpuacct/process_api/cpu.cfs_quota_us": "250000",
                      "sys/fs/cgroup/cpu,cpuacct/process_api/cpu.cfs_period_us": "100000"})
    assert memory_limit(str(root)) == GIB
    assert cpu_quota(str(root)) == 2.5 and cpu_limit(str(root)) == 3


def test_v1_a_container_shown_its_cgroup_at_the_mount_root(tmp_path) -> None:
    # Docker on v1 without a cgroup namespace: /proc/self/cgroup names the host's path, the mount is the cgroup.
    root = write_tree(tmp_path, {
        "proc/self/cgroup": "4:memory:/docker/0123abcd\n3:cpu:/docker/0123abcd\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(3 * GIB),
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000",
        "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
    })
    assert memory_limit(str(root)) == 3 * GIB and cpu_limit(str(root)) == 2


def test_v2_nested_the_lowest_on_the_path_wins(tmp_path) -> None:
    root = write_tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory",
        "sys/fs/cgroup/kubepods/memory.max": str(4 * GIB),
        "sys/fs/cgroup/kubepods/cpu.max": "max 100000",
        "sys/fs/cgroup/kubepods/pod1/memory.max": str(3 * GIB),
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000",
        "sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max",
        "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "400000 100000",
        "sys/fs/cgroup/kubepods/other/memory.max": str(GIB),  # a sibling's limit is not ours
    })
    assert memory_limit(str(root)) == 3 * GIB
    assert cpu_quota(str(root)) == 1.5 and cpu_limit(str(root)) == 2


def test_v2_at_the_root_with_a_cgroup_namespace(tmp_path) -> None:
    root = write_tree(tmp_path, {
        "proc/self/cgroup": "0::/\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory",
        "sys/fs/cgroup/memory.max": str(2 * GIB),
        "sys/fs/cgroup/cpu.max": "50000 100000",
    })
    assert memory_limit(str(root)) == 2 * GIB
    assert cpu_quota(str(root)) == 0.5 and cpu_limit(str(root)) == 1  # never below one


def test_no_limit_anywhere(tmp_path) -> None:
    root = write_tree(tmp_path, {
        "proc/self/cgroup": "4:memory:/a\n3:cpu:/a\n0::/a\n",
        "sys/fs/cgroup/unified/cgroup.controllers": "",
        "sys/fs/cgroup/unified/a/memory.max": "max",
        "sys/fs/cgroup/unified/a/cpu.max": "max 100000",
        "sys/fs/cgroup/memory/a/memory.limit_in_bytes": V1_NO_LIMIT,
        "sys/fs/cgroup/cpu/a/cpu.cfs_quota_us": "-1",
        "sys/fs/cgroup/cpu/a/cpu.cfs_period_us": "100000",
    })
    assert memory_limit(str(root)) is None and cpu_quota(str(root)) is None and cpu_limit(str(root)) is None
    assert memory_limit(str(tmp_path / "empty")) is None and cpu_limit(str(tmp_path / "empty")) is None


def test_unreadable_or_malformed_files_count_as_no_limit(tmp_path) -> None:
    root = write_tree(tmp_path, {
        "proc/self/cgroup": "garbage\n0::/c\n",
        "sys/fs/cgroup/cgroup.controllers": "",
        "sys/fs/cgroup/c/memory.max": "lots",
        "sys/fs/cgroup/c/cpu.max": "",
        "sys/fs/cgroup/memory.max": str(GIB),  # the parent's, still read
    })
    (root / "sys/fs/cgroup/cpu.max").mkdir()  # a directory where a file should be
    assert memory_limit(str(root)) == GIB and cpu_limit(str(root)) is None


def test_without_proc_self_cgroup_the_mount_roots_are_read(tmp_path) -> None:
    root = write_tree(tmp_path, {
        "sys/fs/cgroup/cgroup.controllers": "",
        "sys/fs/cgroup/memory.max": str(GIB),
        "sys/fs/cgroup/cpu.max": "300000 100000",
    })
    assert memory_limit(str(root)) == GIB and cpu_limit(str(root)) == 3


def test_v1_quota_without_its_period_is_no_limit(tmp_path) -> None:
    root = v1_tree(tmp_path)
    (root / "sys/fs/cgroup/cpu,cpuacct/process_api/abc/cpu.cfs_period_us").unlink()
    assert cpu_limit(str(root)) is None and memory_limit(str(root)) == 2 * GIB
