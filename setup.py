"""The optional C extension, built at install time (the metadata is in pyproject.toml).

`sandbox._native._spawn` (src/sandbox/_native/spawn.c, docs/process-start.md) is
optional: where it cannot be built (no C compiler, no Python headers, not x86_64
Linux) the install goes on without it and `sandbox.local.spawn_helper` finds no
module, so processes start through `Popen`. Nothing is compiled after the install.
"""

from __future__ import annotations

import platform
import sys

from setuptools import Extension, setup

# The clone3 call in spawn.c is written for x86_64 Linux; elsewhere nothing is tried.
SPAWN_BUILDS_HERE = sys.platform.startswith("linux") and platform.machine() in (
    "x86_64",
    "amd64",
)

setup(
    ext_modules=[
        Extension(
            "sandbox._native._spawn",
            ["src/sandbox/_native/spawn.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
    if SPAWN_BUILDS_HERE
    else [],
)
