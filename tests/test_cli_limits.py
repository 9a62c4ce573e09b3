"""`sandbox run/shell/mcp --memory-limit/--process-limit/--cpu-limit`: parsed, mapped to
the backend's limit options, enforced; bad values are one usage line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.backends.toolkit.options import options_from_args
from sandbox.backends.unix_local import cgroup_limits
from sandbox.cli.app import _build_parser
from sandbox.cli.limit_flags import parse_cores, parse_count, parse_size
from sandbox.local import cgroups

SANDBOX = [sys.executable, "-m", "sandbox.cli"]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("512M", 512 << 20),
        ("512m", 512 << 20),
        ("1.5G", 3 << 29),
        ("64k", 64 << 10),
        ("10KiB", 10 << 10),
        ("2gb", 2 << 30),
        ("100b", 100),
        ("1T", 1 << 40),
    ],
)
def test_sizes_take_binary_suffixes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-1M", "1.2.3", "0", "12X", "0.1b", "lots", "1e9"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "x", ""])
def test_bad_counts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "two"])
def test_bad_core_counts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_cores(text)


@pytest.mark.parametrize("command", ["run", "shell"])
def test_the_flags_map_to_the_three_options(command: str) -> None:
    args = _build_parser().parse_args(
        [command, "--memory-limit", "512M", "--process-limit", "64", "--cpu-limit", "1.5"]
    )
    backend, options = options_from_args(args)
    assert backend == "unix_local"
    assert options == {"memory_limit_bytes": 512 << 20, "process_limit": 64, "cpu_limit": 1.5}
    # Not given: no option at all (the backend's default, no limit).
    _, options = options_from_args(_build_parser().parse_args([command]))
    assert not set(options) & {"memory_limit_bytes", "process_limit", "cpu_limit"}


def test_mcp_takes_the_same_flags() -> None:
    from sandbox.mcp.server import build_parser as mcp_parser

    args = mcp_parser().parse_args(["--memory-limit", "1G", "--process-limit", "8"])
    _, options = options_from_args(args)
    assert options["memory_limit_bytes"] == 1 << 30 and options["process_limit"] == 8


@pytest.mark.parametrize(
    "flags",
    [
        ["--memory-limit", "lots"],
        ["--memory-limit", "0"],
        ["--process-limit", "0"],
        ["--cpu-limit", "nan"],
    ],
)
def test_a_bad_limit_is_one_usage_line(flags: list[str]) -> None:
    out = subprocess.run(
        [*SANDBOX, "run", *flags, "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert flags[0] in out.stderr


def _limit_reader(controller: str, v1_file: str, v2_file: str) -> str:
    """A shell line that prints this host's limit file of `controller` for itself."""
    how = cgroup_limits.support()[{"pids": "process_limit", "cpu": "cpu_limit"}[controller]]
    mounts = cgroups.cgroup_mounts()
    if how == "cgroup v2":
        point = next(m.point for m in mounts if m.fstype == "cgroup2")
        return f"p=$(sed -n 's/^0:://p' /proc/self/cgroup); cat {point}$p/../{v2_file}"
    point = next(m.point for m in mounts if m.fstype == "cgroup" and controller in m.options)
    pattern = f"s/^[0-9]*:[^:]*\\b{controller}\\b[^:]*://p"
    return f"p=$(sed -n '{pattern}' /proc/self/cgroup); cat {point}$p/{v1_file}"


def test_the_limits_are_in_force_for_the_command(tmp_path: Path) -> None:
    support = cgroup_limits.support()
    if support["process_limit"] is None or support["cpu_limit"] is None:
        pytest.skip(f"no pids or cpu controller here: {support}")
    script = "; ".join(
        (
            _limit_reader("pids", "pids.max", "pids.max"),
            _limit_reader("cpu", "cpu.cfs_quota_us", "cpu.max"),
        )
    )
    out = subprocess.run(
        [
            *SANDBOX,
            "run",
            "--workdir",
            str(tmp_path),
            "--process-limit",
            "64",
            "--cpu-limit",
            "1.5",
            "--",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pids, cpu = out.stdout.splitlines()
    assert pids == "64"
    assert cpu.split()[0] == "150000", "1.5 cores: 150 ms per 100 ms period"


def test_a_memory_hog_under_the_flag_exits_137_saying_why(tmp_path: Path) -> None:
    if cgroup_limits.support()["memory_limit_bytes"] is None:
        pytest.skip("no memory controller here")
    hog = f"{sys.executable} -c 'b = bytearray(512 << 20); print(len(b))'"
    out = subprocess.run(
        [*SANDBOX, "run", "--workdir", str(tmp_path), "--memory-limit", "64M", "--", hog],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 137, out.stderr
    assert "memory limit" in out.stderr
