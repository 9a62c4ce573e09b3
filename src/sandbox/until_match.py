"""Incremental matching of a window's `until` pattern against its decoded text.

Text is fed as it arrives. A substring is searched in the new text plus just enough of
the previous text to catch a match straddling two chunks, so the cost is linear in the
output. A regular expression is searched over the new text plus a bounded look-behind
(`REGEX_LOOKBEHIND` characters), which keeps a chatty process from making each search
rescan everything it printed; a pattern that needs more context than that is documented
as unsupported.
"""

from __future__ import annotations

import re

from .errors import InvalidArgumentError
from .text_decoding import StreamDecoder

REGEX_LOOKBEHIND = 64 * 1024

UntilPattern = str | re.Pattern[str]


def check_until(until: object) -> UntilPattern | None:
    """Validate an `until` argument, raising `InvalidArgumentError` when unusable."""
    if until is None:
        return None
    if isinstance(until, str):
        if not until:
            raise InvalidArgumentError("until must be a non-empty string or a compiled pattern")
        return until
    if isinstance(until, re.Pattern):
        if not isinstance(until.pattern, str):
            raise InvalidArgumentError("until must be a str pattern, not a bytes pattern")
        return until
    raise InvalidArgumentError(
        f"until must be a str or a compiled re.Pattern, not {type(until).__name__}"
    )


class UntilMatcher:
    """Watches one window's output for the `until` pattern."""

    __slots__ = ("_decoder", "_keep", "_pattern", "_window", "matched")

    def __init__(self, pattern: UntilPattern, decoder: StreamDecoder) -> None:
        self._pattern = pattern
        self._decoder = decoder  # a snapshot: decoding here must not disturb the entry's
        self._window = ""
        self._keep = len(pattern) - 1 if isinstance(pattern, str) else REGEX_LOOKBEHIND
        self.matched = False

    def feed(self, segments: list[bytes]) -> bool:
        """Feed newly arrived bytes (segments split by dropped gaps); True on a match."""
        if self.matched:
            return True
        for index, chunk in enumerate(segments):
            if index:  # bytes were dropped between segments: the text is not continuous
                self._decoder.reset()
                self._window = ""
            text = self._window + self._decoder.decode(chunk)
            if self._search(text):
                self.matched = True
                return True
            self._window = text[-self._keep :] if self._keep else ""
        return False

    def _search(self, text: str) -> bool:
        if isinstance(self._pattern, str):
            return self._pattern in text
        return self._pattern.search(text) is not None
