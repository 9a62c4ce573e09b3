"""The `modal` backend's options: their defaults, and the checks `ModalSession`'s
constructor runs on them (`check_options`), every one at construction rather than at
first use (a bad grace period would otherwise surface as a raw TypeError in a teardown).

- `app_name`: the Modal app the sandbox belongs to (looked up, created if missing);
- `image`: a `modal.Image`, or a registry tag such as `"python:3.12-slim"`; default
  Modal's stock image (Debian slim with Python);
- `sandbox_id`: attach to this existing sandbox instead of creating one;
- `keep`: do not terminate the sandbox on close (created or attached: by default
  both are terminated); `sandbox_id` then lets a later session attach to it;
- `token_id`, `token_secret`: the Modal token (default `MODAL_TOKEN_ID` and
  `MODAL_TOKEN_SECRET`), or `client`: a ready `modal.Client` (not closed by us);
- `workdir`: the sandbox's working directory, where relative paths and `cwd` point
  (default `/root`); `env`: variables added to every command;
- `sandbox_timeout_s`: the sandbox's maximum lifetime (default 1 h), a backstop
  should a session never be closed; `create_options`: more `Sandbox.create` options
  (`cpu`, `memory`, `secrets`, `tags`, ...; the tag `sandbox.session` is the
  library's: a created sandbox carries the durable session's id there, which a
  resume checks before it takes on terminating the sandbox);
- `call_timeout_s`: bound on each provider call that is not a stream, over the
  whole call (a lookup, a command's start, a file transfer; default 120 s), and
  `create_timeout_s` on the create (default 600 s: it may build the image first):
  a provider that never answers, or trickles, fails with a retryable
  `ProviderError`; a process's output and exit wait are not bounded;
- `terminate_grace_s`: time between the polite signals and SIGKILL (default 1 s);
- `term`: the `TERM` of terminal commands (default `xterm-256color`; the SDK would
  otherwise copy the client process's own `TERM`, or none);
- `state_dir`: where, in the sandbox, a start cancelled mid-flight leaves its marker
  (default `/tmp/.agent-sandbox-pty`; with the fake, that is this machine);
- `memory_limit_bytes`, `cpu_limit`: the sandbox's memory (a whole number of MiB)
  and CPU (a whole number of millicores), each passed to `Sandbox.create` as both
  request and limit; `process_limit` is refused (Modal has no such setting), as are
  limits with `sandbox_id` (they apply at create; see `limits`);
- `sdk`: the object providing `Sandbox`, `App`, `Client` and `Image` (default the
  `modal` module; tests pass a `sandbox.testing.modal_fake.FakeModal`);
- `runner`: whether processes and commands go through the runner (docs/runner.md):
  put into the sandbox once (by an exec's stdin, skipped when the file at its
  content-named path in `$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else /tmp, has the same
  sha256), started detached and reached by one exec of `connect --start` whose binary
  stdin and stdout carry its frames; processes then outlive the client
  (`keeps_processes`: detach and resume reattach them with what they printed
  meanwhile), stdin stays open until `close_stdin`, kills end the whole tree, and a
  terminal resizes. Refused (`UnsupportedOperationError`) where this install has no
  runner for the sandbox's machine (`uname -m`) or where it cannot be put in or
  started. `None` (the default): the runner where this install has one for the
  sandbox's machine and the sandbox takes it, else the per-exec path, with the reason
  in `runner_fallback_reason` (and a warning when the install had a runner). `False`:
  the per-exec path (every process an exec of its own, ended with its client);

plus the base session's options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import modal

from ...backend import check_env, check_seconds, check_str
from ...errors import InvalidArgumentError
from ..toolkit import Secret, check_limits
from .lifecycle import SESSION_LABEL
from .limits import create_resources

DEFAULT_APP_NAME = "agent-sandbox-pty"
DEFAULT_WORKDIR = "/root"
DEFAULT_SANDBOX_TIMEOUT_S = 3600
DEFAULT_TERM = "xterm-256color"
STATE_ROOT = "/tmp/.agent-sandbox-pty"
# A create may build the image first.
DEFAULT_CREATE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ModalOptions:
    """The options once checked (see the module docstring): the token in `Secret`s,
    `env` a dict, `create_options` with the resource limits' `memory` and `cpu` in it,
    `sdk` the `modal` module unless one was given."""

    app_name: str
    image: Any
    sandbox_id: str | None
    keep: bool
    token_id: Secret | None
    token_secret: Secret | None
    client: Any
    workdir: str
    env: dict[str, str]
    sandbox_timeout_s: int
    create_options: dict[str, Any]
    terminate_grace_s: float
    call_timeout_s: float
    create_timeout_s: float
    state_dir: str
    term: str
    sdk: Any
    runner: bool | None


def check_options(
    *,
    app_name: str,
    image: Any,
    sandbox_id: str | None,
    keep: bool,
    token_id: str | None,
    token_secret: str | None,
    client: Any,
    workdir: str,
    env: Mapping[str, str] | None,
    sandbox_timeout_s: int,
    create_options: Mapping[str, Any] | None,
    terminate_grace_s: float,
    call_timeout_s: float,
    create_timeout_s: float,
    state_dir: str,
    term: str,
    sdk: Any,
    memory_limit_bytes: int | None,
    process_limit: int | None,
    cpu_limit: float | None,
    runner: bool | None = None,
) -> ModalOptions:
    """Check every option (`InvalidArgumentError`, or `UnsupportedOperationError` for a
    limit Modal cannot apply) and answer them as `ModalOptions`."""
    limits = check_limits(
        memory_limit_bytes=memory_limit_bytes, process_limit=process_limit, cpu_limit=cpu_limit
    )
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise InvalidArgumentError(f"workdir must be an absolute path, not {workdir!r}")
    check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
    check_seconds("call_timeout_s", call_timeout_s)
    check_seconds("create_timeout_s", create_timeout_s)
    if (
        isinstance(sandbox_timeout_s, bool)
        or not isinstance(sandbox_timeout_s, int)
        or sandbox_timeout_s <= 0
    ):
        raise InvalidArgumentError(
            f"sandbox_timeout_s must be a positive int (seconds), not {sandbox_timeout_s!r}"
        )
    for name, text in (
        ("app_name", app_name),
        ("sandbox_id", sandbox_id),
        ("token_id", token_id),
        ("token_secret", token_secret),
        ("state_dir", state_dir),
        ("term", term),
    ):
        check_str(name, text)
    if not term or "\0" in term:
        raise InvalidArgumentError("term must be a non-empty terminal type, such as 'xterm'")
    env = check_env(env)
    if runner is not None and not isinstance(runner, bool):
        raise InvalidArgumentError(f"runner must be True, False or None, not {runner!r}")
    if create_options is not None and not isinstance(create_options, Mapping):
        raise InvalidArgumentError("create_options must be a mapping of option names")
    if create_options and create_options.get("env") is not None:
        # What reaches every command's environment is checked like `env`.
        given = create_options["env"]
        if isinstance(given, Mapping):  # None unsets a variable in Modal's env
            given = {k: v for k, v in given.items() if v is not None}
        check_env(given, name="create_options['env']")
    given_tags = (create_options or {}).get("tags")
    if given_tags is not None:
        check_env(given_tags, name="create_options['tags']", variables=False)
        if SESSION_LABEL in given_tags:
            raise InvalidArgumentError(
                f"create_options['tags'][{SESSION_LABEL!r}] is the library's own mark of "
                "the sandboxes it creates: choose another tag"
            )
    resources = create_resources(limits, attach=sandbox_id is not None)
    for name in set(resources) & set(create_options or {}):
        raise InvalidArgumentError(
            f"create_options[{name!r}] and a resource limit both set the sandbox's {name}"
        )
    return ModalOptions(
        app_name=app_name,
        image=image,
        sandbox_id=sandbox_id,
        keep=keep,
        token_id=Secret(token_id) if token_id else None,
        token_secret=Secret(token_secret) if token_secret else None,
        client=client,
        workdir=workdir,
        env=dict(env or {}),
        sandbox_timeout_s=sandbox_timeout_s,
        create_options={**(create_options or {}), **resources},
        terminate_grace_s=terminate_grace_s,
        call_timeout_s=float(call_timeout_s),
        create_timeout_s=float(create_timeout_s),
        state_dir=state_dir,
        term=term,
        sdk=sdk if sdk is not None else modal,
        runner=runner,
    )
