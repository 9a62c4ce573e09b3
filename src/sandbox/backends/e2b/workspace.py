"""E2B's half of the workspace calls that are not file operations (those run through
`sandbox.workspace.shell_ops`): the exposed port.

`AsyncSandbox.get_host(port)` (e2b `sandbox/main.py`, `ConnectionConfig.get_host`)
answers `<port>-<sandbox id>.<sandbox domain>`, which E2B's edge serves over HTTPS for
any port a process listens on; in the SDK's debug mode it is `localhost:<port>`, plain
HTTP. No header is needed (a sandbox created with `secure` and a traffic token is not
opened by this backend).
"""

from __future__ import annotations

from ...backend import ExposedPort, http_url


def exposed_from_host(host: str, port: int) -> ExposedPort:
    """The `ExposedPort` for what `get_host(port)` answered."""
    if host.startswith("localhost:"):  # the SDK's debug mode: the sandbox is this host
        return ExposedPort(url=http_url("localhost", port), host="localhost", port=port)
    return ExposedPort(url=f"https://{host}/", host=host, port=443, tls=True)
