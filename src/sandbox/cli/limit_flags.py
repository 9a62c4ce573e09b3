"""`--memory-limit`, `--process-limit` and `--cpu-limit`: the three limit options of every
backend (`memory_limit_bytes`, `process_limit`, `cpu_limit`) as command-line flags.

Sizes take a binary suffix (`512M` is 512 MiB, `1.5G`, `64k`; `B` or none: bytes), the
way `docker run --memory` reads them. A malformed value is refused by argparse with a
message naming the flag (exit status 2); the backend then checks what it can enforce
and refuses the rest with `UnsupportedOperationError` naming the option.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from ..backends.toolkit.limits import CPU, MEMORY, PROCESSES

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*|\s*(\d+)\s*b\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from `512M`, `1.5G`, `64KiB`, `4096`: binary multiples, at least 1 byte."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 512M, 2G or 1048576, not {text!r}"
        )
    if match.group(3) is not None:
        number, unit = match.group(3), ""
    else:
        number, unit = match.group(1), match.group(2).lower()
    size = math.floor(float(number) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, not {text!r}")
    return size


def parse_count(text: str) -> int:
    """A positive whole number of processes."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text!r}")
    return int(text)


def parse_cores(text: str) -> float:
    """A positive, finite number of CPU cores (`1.5`)."""
    try:
        cores = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of cores, not {text!r}") from None
    if not math.isfinite(cores) or cores <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of cores, not {text!r}")
    return cores


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the three limit flags (each maps to the backend option of the same idea)."""
    parser.add_argument(
        "--memory-limit",
        type=parse_size,
        metavar="SIZE",
        help="memory_limit_bytes: the session's memory (512M, 2G, bytes)",
    )
    parser.add_argument(
        "--process-limit",
        type=parse_count,
        metavar="N",
        help="process_limit: how many processes the session may have at once",
    )
    parser.add_argument(
        "--cpu-limit",
        type=parse_cores,
        metavar="CORES",
        help="cpu_limit: the CPU time the session may use, in cores (1.5)",
    )


def limit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The limit options given on the command line, by their backend option names."""
    given = {
        MEMORY: getattr(args, "memory_limit", None),
        PROCESSES: getattr(args, "process_limit", None),
        CPU: getattr(args, "cpu_limit", None),
    }
    return {name: value for name, value in given.items() if value is not None}
