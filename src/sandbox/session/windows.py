"""The collection window: what one `pty_*` call waits for and returns.

A window ends at its deadline, when the process's output is done, when `until` appears
in the output, when `until_screen` appears on the rendered screen, or (a poll) while a
write waits for the entry. `collect_window` runs that loop over one entry and builds the
`PtyUpdate`; it owns no state and never touches the registry: the session removes an
entry whose window says it finished.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from ..output.truncation import truncate_to_tokens
from ..output.until import UntilMatcher, UntilPattern, check_until
from ..process_entry import H, PtyEntry
from ..types import PtyUpdate

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from ..terminal.screen import ScreenSnapshot

# One turn of a screen's emulation or rendering (`pty_screen`, an `until_screen` check)
# works at most about this long before yielding to the event loop.
SCREEN_CHECK_SLICE_S = 0.005


def check_until_screen(until_screen: object, has_screen: bool) -> UntilPattern | None:
    """The checked `until_screen` pattern; `InvalidArgumentError` without a screen."""
    pattern = check_until(until_screen)
    if pattern is not None and not has_screen:
        raise InvalidArgumentError(
            "until_screen needs a rendered screen: a tty process started with screen=True"
        )
    return pattern


def screen_matches(pattern: UntilPattern, snapshot: ScreenSnapshot) -> bool:
    """Whether `pattern` (a substring or a compiled regex) appears in the screen's text."""
    text = snapshot.text()
    if isinstance(pattern, re.Pattern):
        return pattern.search(text) is not None
    return pattern in text


async def render_by(entry: PtyEntry[H], deadline: float) -> ScreenSnapshot | None:
    """Emulate the entry's queued output a slice at a time (yielding between slices)
    until caught up or the loop time `deadline`; then the snapshot (its changed rows
    rendered in slices too). None for an entry without a screen."""
    screen = entry.screen
    if screen is None or screen.too_large:  # resized past the bound meanwhile
        return None
    return await screen.render(SCREEN_CHECK_SLICE_S, deadline=deadline)


async def collect_window(
    entry: PtyEntry[H],
    window_s: float,
    until: UntilPattern | None,
    max_tokens: int | None,
    *,
    final_drain: Callable[[PtyEntry[H]], Awaitable[None]],
    poll: bool = False,
    until_screen: UntilPattern | None = None,
) -> tuple[PtyUpdate, bool]:
    """Wait out one window over `entry`, then drain what it printed into a `PtyUpdate`.

    `final_drain` (the backend's hook) runs once when the deadline is reached, to move
    output already at the transport into the entry. Returns the update and whether the
    process is finished (its output done: the caller then removes the entry, and the
    update carries no `process_id`).
    """
    loop = entry.loop
    deadline = loop.time() + window_s
    output = entry.output
    matcher = UntilMatcher(until, entry.decoder.snapshot()) if until is not None else None
    scanned = output.start_pos
    # The screen is checked once there is output this window returns (like `until`,
    # which searches it), and after every change; a poll checks it at once.
    screen_checked = -1 if poll else scanned
    snapshot: ScreenSnapshot | None = None
    wants_data = matcher is not None or until_screen is not None
    while True:
        if poll and entry.writers_waiting:
            break  # keystrokes wait for this entry: a poll never holds them back
        # Only new bytes are searched (a write's window first looks before any came).
        if matcher is not None and output.end_pos != scanned:
            segments = output.since(scanned)
            scanned = output.end_pos
            if await matcher.feed_async(segments, deadline, loop=loop):
                break
        if until_screen is not None and output.end_pos != screen_checked:
            screen_checked = output.end_pos
            snapshot = await render_by(entry, deadline)
            if snapshot is not None and screen_matches(until_screen, snapshot):
                break
        if entry.output_done:
            break
        if loop.time() >= deadline:
            await final_drain(entry)
            break
        await entry.wait_for_change(deadline, wants_data=wants_data)
    if until_screen is not None:
        # What the model sees with the output: the screen at the window's end.
        snapshot = await render_by(entry, loop.time() + SCREEN_CHECK_SLICE_S)
    finished = entry.output_done
    text = entry.decoder.decode_drained(output.drain(), final=finished)
    original_tokens = None
    if max_tokens is not None:
        truncated = truncate_to_tokens(text, max_tokens)
        text, original_tokens = truncated.text, truncated.original_token_count
    update = PtyUpdate(
        process_id=None if finished else entry.process_id,
        output=text,
        exit_code=entry.exit_code if entry.exited else None,
        original_token_count=original_tokens,
        screen=snapshot,
    )
    return update, finished
