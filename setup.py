"""What the install builds besides the Python sources (the metadata is in pyproject.toml):
the optional C extension and the optional runner binary.

`sandbox._native._spawn` (src/sandbox/_native/spawn.c, docs/process-start.md) is
optional: where it cannot be built (no C compiler, no Python headers, not x86_64
Linux) the install goes on without it and `sandbox.local.spawn_helper` finds no
module, so processes start through `Popen`. Nothing is compiled after the install.

The runner (runner/, docs/runner.md) is built by `build_runner`, a step of `build`, so
`pip install .`, `pip wheel .` and `python -m build` ship it as
`sandbox/runner/bin/sandbox-runner-linux-<arch>`, built with the flags `make runner`
uses. It is optional too: without cargo, on another platform, when the build fails or
with `SANDBOX_NO_RUNNER=1`, a warning is printed, `bin/NOT-BUILT` says why
(`sandbox backends` shows it) and the install goes on; the backends then keep their
per-exec path.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Command, Extension, setup
from setuptools.command.build import build

HERE = Path(__file__).resolve().parent

# The clone3 call in spawn.c is written for x86_64 Linux; elsewhere nothing is tried.
SPAWN_BUILDS_HERE = sys.platform.startswith("linux") and platform.machine() in (
    "x86_64",
    "amd64",
)

# The runner's build switch, read as SANDBOX_NO_EXTENSIONS is (any value but "" and "0").
NO_RUNNER = "SANDBOX_NO_RUNNER"
RUNNER_CRATE = HERE / "runner"
# `uname -m` spellings -> the architecture in the binary's name and in the rust target;
# the same table as sandbox.runner.binary's (which setup.py cannot import: the package's
# dependencies are not installed yet).
RUNNER_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
# Package-relative, where sandbox.runner.binary looks (bin_dir, binary_name, NOT_BUILT_NOTE).
RUNNER_BIN_DIR = Path("sandbox", "runner", "bin")
RUNNER_PREFIX = "sandbox-runner-linux-"
NOT_BUILT = "NOT-BUILT"


def _switch_set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _warn(message: str) -> None:
    # stderr, like the warning setuptools prints for an optional extension that failed.
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _runner_sources() -> list[Path]:
    """What the binary is made from (what the sdist carries: MANIFEST.in)."""
    sources = [RUNNER_CRATE / "Cargo.toml", RUNNER_CRATE / "Cargo.lock"]
    return sources + sorted((RUNNER_CRATE / "src").rglob("*.rs"))


class build_runner(Command):
    """Build the runner with cargo and put it into the package's `runner/bin/`.

    A sub-command of `build` (after `build_py`, which has already copied whatever
    `src/sandbox/runner/bin/` holds as package data). Cargo runs every time: its own
    fingerprints (sources, Cargo.lock, flags, toolchain) decide whether anything is
    compiled, and with `runner/target` warm (`make runner` leaves it so) the run is a
    no-op of well under a second. Without cargo, a binary already in the source tree is
    shipped only when it is newer than every runner source, since there is nothing then
    to check it against but mtimes. In an editable install the binary goes into the
    source tree (`src/sandbox/runner/bin/`, what `make runner` does), like the
    extension built in place.
    """

    description = "build the runner binary (runner/, cargo) into the package"
    user_options: list[tuple[str, str | None, str]] = []
    editable_mode = False  # set by setuptools for an editable install (PEP 660)

    def initialize_options(self) -> None:
        self.build_lib: str | None = None
        self._outputs: list[str] = []

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _bin_dir(self) -> Path:
        if self.editable_mode:
            return HERE / "src" / RUNNER_BIN_DIR
        return Path(self.build_lib or "build/lib", RUNNER_BIN_DIR)

    def get_outputs(self) -> list[str]:
        """The files this command wrote (setuptools' build sub-command protocol)."""
        return list(self._outputs)

    def get_output_mapping(self) -> dict[str, str]:
        """Nothing is copied from a source file: the binary is compiled."""
        return {}

    def get_source_files(self) -> list[str]:
        """The runner's sources, relative to the project (what the sdist must hold)."""
        return [str(path.relative_to(HERE)) for path in _runner_sources() if path.exists()]

    def run(self) -> None:
        """Build and place the binary, or say why not; never fails the install."""
        arch = RUNNER_ARCHES.get(platform.machine().lower())
        bin_dir = self._bin_dir()
        name = RUNNER_PREFIX + (arch or platform.machine())
        if _switch_set(NO_RUNNER):
            why = f"{NO_RUNNER} set at install"
        elif not sys.platform.startswith("linux") or arch is None:
            why = f"no runner build on {sys.platform} {platform.machine()}"
        elif not (RUNNER_CRATE / "Cargo.toml").is_file():
            why = "runner sources missing at install"
        elif shutil.which("cargo") is None:
            why = self._without_cargo(bin_dir / name)
        else:
            why = self._cargo_build(arch, bin_dir / name)
        if why and self.editable_mode and (bin_dir / name).is_file():
            _warn(
                f"the sandbox runner was not built ({why}): the editable install uses "
                f"the one already in {(bin_dir / name).relative_to(HERE)}"
            )
        elif why:
            _warn(
                f"the sandbox runner is not in this install ({why}): "
                "the backends keep their per-exec path"
            )
            # An editable install leaves the source tree as it was when it built nothing
            # (no untracked note appears there).
            if not self.editable_mode:
                # What build_py copied from the source tree is not shipped either.
                (bin_dir / name).unlink(missing_ok=True)
                self._write(bin_dir / NOT_BUILT, why + "\n")
        elif not self.editable_mode:
            # A note an earlier build left in the build folder, or build_py copied.
            (bin_dir / NOT_BUILT).unlink(missing_ok=True)

    def _without_cargo(self, target: Path) -> str:
        """'' when the binary build_py copied from the source tree is current, else why
        there is none."""
        if not target.is_file():
            return "cargo missing at install"
        newest_source = max(p.stat().st_mtime for p in _runner_sources() if p.exists())
        if target.stat().st_mtime < newest_source:
            return "cargo missing at install; the binary in the source tree is older than runner/"
        print(
            "cargo not found: shipping the sandbox runner already in the source tree "
            "(newer than every runner source)",
            file=sys.stderr,
            flush=True,
        )
        self._outputs.append(str(target))
        return ""

    def _cargo_build(self, arch: str, target: Path) -> str:
        """Run cargo as `make runner` does and copy the result to `target`: '' when
        done, else why not."""
        env = dict(os.environ, RUSTFLAGS="-C target-feature=+crt-static")
        # It would replace RUSTFLAGS in cargo, and the flags are to be the Makefile's.
        env.pop("CARGO_ENCODED_RUSTFLAGS", None)
        command = [
            "cargo",
            "build",
            "--quiet",
            "--release",
            "--locked",
            "--target",
            f"{arch}-unknown-linux-gnu",
            "--manifest-path",
            str(RUNNER_CRATE / "Cargo.toml"),
            # The artifacts as JSON on stdout (the binary's path, wherever CARGO_TARGET_DIR
            # or a cargo config put the target folder); errors still rendered on stderr.
            "--message-format=json-render-diagnostics",
        ]
        print("building the sandbox runner: " + " ".join(command), file=sys.stderr, flush=True)
        try:
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        except OSError as exc:
            return f"cargo did not start: {exc}"
        if done.returncode != 0:
            return f"cargo build failed at install, exit {done.returncode}"
        built = None
        for line in done.stdout.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("reason") == "compiler-artifact" and message.get("executable"):
                built = Path(message["executable"])
        if built is None or not built.is_file():
            return "cargo reported no runner binary"
        target.parent.mkdir(parents=True, exist_ok=True)
        # Through a temporary name: a half-copied binary is never what the package holds.
        partial = target.with_name(target.name + ".tmp")
        shutil.copyfile(built, partial)
        partial.chmod(0o755)
        partial.replace(target)
        self._outputs.append(str(target))
        return ""

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self._outputs.append(str(path))


class build_with_runner(build):
    """`build`, then `build_runner` (after build_py and build_ext)."""

    sub_commands = [*build.sub_commands, ("build_runner", None)]


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
    cmdclass={"build": build_with_runner, "build_runner": build_runner},
)
