"""`LocalCommands`: what a unix_local command runs as — its argv (the jail's, when
confined), environment, cwd on the host, and the check a jailed command needs.

Made with the session from its options; `enter_jail` completes it at the start, once
bubblewrap and the read-only paths were found (a confined session runs nothing before).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ...backend import CommandSpec
from ..toolkit import CommandCheck
from . import confine as jail
from . import processes
from .workspace import Workspace


class LocalCommands:
    """The argv, environment and cwd of the session's commands (see the module)."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        env: Mapping[str, str],
        inherit_env: bool,
        confine: bool,
        network: bool,
        readonly_paths: Sequence[str],
    ) -> None:
        self.workspace = workspace
        self.confine = confine
        self.inherit_env = inherit_env
        # As given (a ref names them so): checked against the host at the start.
        self.readonly_request = tuple(readonly_paths)
        self._env = env
        self._network = network
        self._readonly_paths: list[str] = []
        self._bwrap: str | None = None  # found by `enter_jail`

    def enter_jail(self, bwrap: str) -> None:
        """At a confined session's start: the bubblewrap to run, and the read-only
        paths checked now (they must exist on the host)."""
        self._bwrap = bwrap
        self._readonly_paths = jail.check_readonly_paths(self.readonly_request)

    def cwd(self, spec: CommandSpec) -> str:
        """`spec`'s working folder on the host (the workspace's, or one under it)."""
        return self.workspace.cwd_for(spec.cwd)

    def environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        """The environment `spec` runs with (`processes.command_environment`)."""
        return processes.command_environment(
            spec,
            tty=tty,
            inherit_env=self.inherit_env,
            env=self._env,
            confine=self.confine,
            home=self.workspace.path,
            pwd=self.cwd(spec),
        )

    def argv(self, spec: CommandSpec) -> list[str]:
        """The argv actually executed: `spec`'s, or the jail's around it."""
        if not self.confine:
            return list(spec.argv)
        assert self._bwrap is not None, "a confined session runs commands only once started"
        return jail.jail_argv(
            spec.argv,
            bwrap=self._bwrap,
            workspace=self.workspace.path,
            cwd=self.cwd(spec),
            network=self._network,
            readonly_paths=self._readonly_paths,
        )

    def checked(
        self, spec: CommandSpec, *, announce: bool
    ) -> tuple[CommandSpec, CommandCheck | None]:
        """The command to start, and its check (None: not needed; see
        `processes.checked_command`)."""
        return processes.checked_command(
            spec, confine=self.confine, cwd=self.cwd(spec), announce=announce
        )

    def for_runner(self, command: CommandSpec) -> tuple[CommandSpec, str]:
        """The command the runner starts (the jail's argv when confined: `command` is
        then the checked one) and its cwd on the host. Unconfined, the runner reports a
        missing cwd or program itself; in the jail, bwrap changes into the cwd."""
        cwd = self.cwd(command)
        if not self.confine:
            return command, cwd
        return dataclasses.replace(command, argv=tuple(self.argv(command))), self.workspace.path
