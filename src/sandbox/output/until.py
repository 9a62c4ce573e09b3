"""Incremental matching of a window's `until` pattern against its decoded text.

Text is fed as it arrives, and the work per arrival is bounded so that a window stays a
maximum wait even for a pathological pattern on a flood of output.

A substring is searched in the new text plus just enough of the previous text to catch a
match straddling two chunks (`len(pattern) - 1` characters): exact, and linear. Unless it
holds U+FFFD, it is searched as its UTF-8 bytes in the raw output, without decoding (see
`byte_needle`: the same matches).

A regular expression cannot be searched that way (it may need any amount of context, and
a backtracking search can cost the square of its input or worse), so each search is
given a bounded string: at most the last `REGEX_LOOKBEHIND` characters of the window's
text (across lines), followed by the next piece of new text, at most `REGEX_PIECE`
characters. The search
string is never longer than their sum, whatever the output, so the cost of one search is
bounded and the cost of a window is linear in its output. See `UntilMatcher`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque

from ..errors import InvalidArgumentError
from .decoding import StreamDecoder, leading_continuation_len

# Both are small on purpose: a pattern such as `.*X$` costs the square of its search
# string, about 20 ms for 8 KiB here but over a second for 64 KiB, and the event loop
# (every session on it) waits for each search.
REGEX_LOOKBEHIND = 4 * 1024
REGEX_PIECE = 4 * 1024
# `feed_async` lets the loop run other tasks after this much searching.
SLICE_S = 0.01

UntilPattern = str | re.Pattern[str]

# What a regex search sees as the character before text that follows a gap of dropped
# bytes (U+FFFD, the replacement character: an unknown character, neither a line break
# nor a word character).
GAP_CONTEXT = "\ufffd"


def byte_needle(pattern: UntilPattern) -> bytes | None:
    """The UTF-8 bytes to search the raw output for, when that finds exactly the matches
    of the substring `pattern` in the decoded text; None for a regex, or a substring
    holding U+FFFD or a lone surrogate (searched in the text instead).

    Exact because decoding never joins a byte that starts a character to the sequence
    before it (an invalid sequence becomes U+FFFD up to, not including, such a byte):
    the needle starts with one and is made of whole, valid sequences, so wherever its
    bytes occur the text holds the pattern, and a pattern without U+FFFD in the text
    came from exactly those bytes. The decoder's held-back partial character is put
    before the window's bytes (it may start the match), and after a gap the search
    starts afresh, as the text does.
    """
    if not isinstance(pattern, str) or "\ufffd" in pattern:
        return None
    try:
        return pattern.encode("utf-8")
    except UnicodeEncodeError:
        return None


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
    r"""Watches one window's output for the `until` pattern.

    A substring is found exactly, wherever it lies in the window's text (text on either
    side of a gap of dropped bytes is not joined).

    A compiled pattern is searched (`pattern.search`) as the text arrives, over a bounded
    string: at most the last `REGEX_LOOKBEHIND` (4096) characters of the window's text
    (across lines), followed by the next at most `REGEX_PIECE` (4096) characters of new
    text. Hence:

    - a match at most `REGEX_LOOKBEHIND` characters long is always found, whether or not
      it spans lines (a prompt after a command's echo, `ping\r\n...ping`);
    - a longer match is found only if one search string happens to hold it all, which
      depends on how the output arrives: do not rely on it;
    - `$` and `\Z` match at the end of a search string: the end of the text received so
      far (or of a 4096-character piece of it, when more arrives at once);
    - `^` matches at a real line start or the window's start, `\A` only at the window's
      start (the start of the text this window returns, wherever the process's line
      was), and `\b` and a one-character look-behind see the character before the kept
      text: a cut in the text is never mistaken for a line start. After a gap of
      dropped bytes that character is unknown: it is taken as U+FFFD (`GAP_CONTEXT`),
      so neither `^` nor `\A` matches right after the gap, and `\b` does before a word.

    One search costs at most what the pattern costs on 8 KiB of text (a catastrophic
    pattern, exponential in its input, can still be slow on that). `feed` checks its
    budget between searches; `feed_async` also stops at the window's deadline and lets
    the event loop breathe between searches.
    """

    __slots__ = (
        "_bytes",
        "_decoder",
        "_keep",
        "_needle",
        "_pattern",
        "_pending",
        "_start",
        "_window",
        "matched",
    )

    def __init__(self, pattern: UntilPattern, decoder: StreamDecoder) -> None:
        self._pattern = pattern
        self._decoder = decoder  # a snapshot: decoding here must not disturb the entry's
        # Text kept from earlier arrivals. For a regex, `_window[_start:]` is the current
        # line (capped) and `_window[:_start]` is the one character before it (its
        # newline, or the character before the cap), kept so that `^` and look-behinds
        # see the real context; `_start` is 0 only while the line began the window.
        self._window = ""
        self._start = 0
        # A substring searched as bytes (`byte_needle`): the raw bytes kept from earlier
        # arrivals, starting with the partial character the decoder holds back.
        self._needle = byte_needle(pattern)
        self._bytes = decoder.pending
        # Text (or, for a needle, bytes) not searched yet, in pieces; None marks a gap of
        # dropped bytes.
        self._pending: deque[str | bytes | None] = deque()
        # The overlap a substring keeps: one unit short of the pattern, in its own units.
        self._keep = 0
        if self._needle is not None:
            self._keep = len(self._needle) - 1
        elif isinstance(pattern, str):
            self._keep = len(pattern) - 1
        self.matched = False

    def feed(self, segments: list[bytes], *, budget_s: float | None = None) -> bool:
        """Feed newly arrived bytes (segments split by dropped gaps); True on a match.

        With `budget_s`, searching stops once that many seconds were spent: the rest of
        the text is only kept as look-behind, and False is returned. One search may
        overrun the budget by its own (bounded) cost.
        """
        if self.matched:
            return True
        self._enqueue(segments)
        stop = None if budget_s is None else time.monotonic() + budget_s
        while self._pending:
            if stop is not None and time.monotonic() >= stop:
                self._skip_pending()
                break
            if self._step():
                return True
        return False

    async def feed_async(
        self,
        segments: list[bytes],
        deadline: float,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> bool:
        """`feed` for a window's loop: stop searching at `deadline` (in the running loop's
        time), and let the loop run other tasks after every `SLICE_S` of searching, so
        that much output arriving at once never stalls it for longer than that plus one
        (bounded) search. `loop` is the running loop, when the caller has it at hand."""
        if self.matched:
            return True
        self._enqueue(segments)
        if loop is None:
            loop = asyncio.get_running_loop()
        slice_end = loop.time() + SLICE_S
        while self._pending:
            now = loop.time()
            if now >= deadline:
                self._skip_pending()
                break
            if now >= slice_end:
                await asyncio.sleep(0)
                slice_end = loop.time() + SLICE_S
                continue  # the deadline may have passed while others ran
            if self._step():
                return True
        return False

    def _enqueue(self, segments: list[bytes]) -> None:
        if self._needle is not None:  # searched as they are: nothing to decode
            for index, chunk in enumerate(segments):
                if index:
                    self._pending.append(None)
                self._pending.append(chunk)
            return
        for index, chunk in enumerate(segments):
            if index:  # bytes were dropped between segments: the text is not continuous
                self._pending.append(None)
                # Reset here, before the next segment is decoded: a character cut by the
                # gap was never printed whole (its lead byte must not join the bytes
                # after the gap), and what this segment leaves pending belongs to the
                # next arrival. The window's text skips the cut's continuation bytes too.
                self._decoder.reset()
                chunk = chunk[leading_continuation_len(chunk) :]
            text = self._decoder.decode(chunk)
            if isinstance(self._pattern, str):
                self._pending.append(text)  # linear to search, however long
            else:
                self._pending.extend(
                    text[offset : offset + REGEX_PIECE]
                    for offset in range(0, len(text), REGEX_PIECE)
                )

    def _step(self) -> bool:
        """Search the next pending piece; True (and `matched`) on a match."""
        piece = self._pending.popleft()
        if piece is None:
            self._restart()
            return False
        if isinstance(piece, bytes):  # only a needle queues bytes
            self._bytes += piece
            if self._needle is not None and self._needle in self._bytes:
                self.matched = True
                return True
            self._trim_bytes()
            return False
        self._window += piece
        if isinstance(self._pattern, str):
            found = self._pattern in self._window
        else:
            found = self._pattern.search(self._window, self._start) is not None
        if found:
            # What is still pending is never searched: a match is sticky (`feed`), and
            # the window that made this matcher ends with it.
            self.matched = True
            return True
        self._trim()
        return False

    def _skip_pending(self) -> None:
        """Out of budget: keep the pending text as context for a later search only."""
        while self._pending:
            piece = self._pending.popleft()
            if piece is None:
                self._restart()
            elif isinstance(piece, bytes):
                self._bytes += piece
                self._trim_bytes()
            else:
                self._window += piece
                self._trim()

    def _restart(self) -> None:
        # The decoder was reset when the gap was queued (`_enqueue`), not here: by now
        # it may hold the start of a character that the next arrival completes.
        if isinstance(self._pattern, str):
            self._window = ""
            self._bytes = b""  # nor does the partial character from before the gap
            return
        # The text after a gap goes on from a character nobody saw: a regex search then
        # starts after a stand-in for it (no line break, no word character), so neither
        # `^` nor `\A` takes the cut for a line or window start.
        self._window = GAP_CONTEXT
        self._start = 1

    def _trim_bytes(self) -> None:
        """Keep the overlap of a needle: one byte short of it."""
        self._bytes = self._bytes[max(0, len(self._bytes) - self._keep) :]

    def _trim(self) -> None:
        """Keep what the next search needs: for a substring, the overlap; for a regex,
        the current line, capped, plus the one character before it."""
        window = self._window
        if isinstance(self._pattern, str):
            self._window = window[-self._keep :] if self._keep else ""
            return
        cut = len(window) - REGEX_LOOKBEHIND
        if cut <= self._start:
            return  # all of it is still within the look-behind
        self._window = window[cut - 1 :]
        self._start = 1
