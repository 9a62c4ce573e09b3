"""Provider credentials: found in an option or the environment, never shown.

`require_credential` gives every backend the same lookup and the same message when a
credential is missing (naming the variable to set); `Secret` holds a credential so that
no repr, str or format string can print it.
"""

from __future__ import annotations

import os

from ...errors import CredentialsMissingError

REDACTED = "<redacted>"


class Secret:
    """A credential that never shows itself in a repr, str or format string."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value itself, for the one place that must send it (a header, a URL)."""
        return self._value

    def redact(self, text: str) -> str:
        """`text` with every occurrence of the secret replaced."""
        return text.replace(self._value, REDACTED) if self._value else text

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def require_credential(option: str | None, env_var: str, *, backend: str, what: str) -> str:
    """`option` if given, else the value of `env_var`; `CredentialsMissingError` naming
    both when neither is set. The option's name is `env_var`'s role, e.g. `api_key`."""
    value = option if option else os.environ.get(env_var)
    if not value:
        raise CredentialsMissingError(
            f"the {backend} backend needs {what}: set the {env_var} environment variable "
            "or pass it as an option to open_session"
        )
    return value
