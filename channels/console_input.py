"""How what is read from the console's stdin becomes messages.

A typed line never waits, and a paste is one message: a message goes out the moment the
input is at a line end and nothing more is readable (the reader asks the kernel, not a
clock). A canonical-mode terminal hands a paste over one line per read, but all of it is
buffered when the first line wakes the reader; a pipe hands over what was written at
once. Only input that stops mid-line (a chunk boundary: typed lines end in Enter) or a
burst over :data:`BIG_BURST_CHARS` (a terminal buffers 4 KiB, so a longer paste comes in
pieces) waits :data:`PASTE_GRACE_S` for the rest. Bracketed-paste markers hold what is
between them however slowly it comes. A paste still cut in two makes two messages, and
the gateway folds the second into the turn the first started while it has shown
nothing (``queue.debounce_ms``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
PASTE_MARKER = re.compile("(\x1b\\[20[01]~)")
PASTE_GRACE_S = 0.02  # how long input that is surely still arriving may take to go on
BIG_BURST_CHARS = 4096  # a terminal's line buffer: a longer burst is a paste in pieces
MAX_MESSAGE_CHARS = 1 << 20  # a message is cut here, so endless input cannot fill memory


class InputGatherer:
    """Turns stdin's text into messages. The reader calls :meth:`feed` with what it read
    and :meth:`settle` once nothing more is readable; complete lines go out then (see the
    module docstring), an unfinished line waits for its Enter."""

    def __init__(self, emit: Callable[[str], None], grace_s: float = PASTE_GRACE_S) -> None:
        self._emit = emit
        self._grace_s = grace_s
        self._buffer = ""
        self._held = ""  # the start of a paste marker cut by a read boundary
        self._in_paste = False
        self._paste_end = 0  # where the last paste ended: its lines go out together
        self._burst = 0  # characters read since the last message went out
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """A grace timer runs: lines are held for what is still arriving."""
        return self._timer is not None

    def feed(self, text: str) -> None:
        self._cancel_timer()
        self._burst += len(text)
        pieces = PASTE_MARKER.split(self._held + text)
        self._held = ""
        for i, piece in enumerate(pieces):
            if i % 2:  # a marker
                self._in_paste = piece == PASTE_START
                self._paste_end = len(self._buffer)
                continue
            cut = piece.rfind("\x1b", max(0, len(piece) - len(PASTE_START) + 1))
            if i == len(pieces) - 1 and cut >= 0 and _marker_start(piece[cut:]):
                piece, self._held = piece[:cut], piece[cut:]
            self._buffer += piece
        if len(self._buffer) >= MAX_MESSAGE_CHARS:
            self._flush(everything=True)

    def settle(self) -> None:
        """Nothing more is readable right now."""
        self._cancel_timer()
        end = self._line_end()
        if self._in_paste or end < 0:
            return
        if end == len(self._buffer) - 1 and not self._held and self._burst < BIG_BURST_CHARS:
            self._flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(self._grace_s, self._flush)

    def finish(self) -> None:
        """End of input: whatever is left (a last line without Enter) is a message too."""
        self._cancel_timer()
        self._buffer += self._held
        self._held = ""
        self._flush(everything=True)

    def _line_end(self) -> int:
        """The newline that ends what may go out now: the last one, and not inside a paste."""
        return self._buffer.rfind("\n", self._paste_end)

    def _flush(self, everything: bool = False) -> None:
        self._timer = None
        end = len(self._buffer) if everything else self._line_end()
        if end < 0:
            return
        text, self._buffer = self._buffer[:end], self._buffer[end + 1:]
        self._paste_end = 0
        self._burst = len(self._buffer)
        if text:
            self._emit(text)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _marker_start(text: str) -> bool:
    return PASTE_START.startswith(text) or PASTE_END.startswith(text)
