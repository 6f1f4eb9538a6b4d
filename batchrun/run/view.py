"""What a run asks of the view it is shown in, which its caller opens for it.

The run emits its events to a `ProgressSink`, passes it its news (a signal's
acknowledgement: `news.News`, values), ticks it in quiet spells, and closes it
at the end; the caller (the command line's live view or plain log) decides what
a person sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from batchrun.core.clock import Clock
from batchrun.core.events import EventSink, RunTally, Status
from batchrun.core.responses import Responses

if TYPE_CHECKING:
    from batchrun.run.news import News

# A plain log quiet this long (a long wait for a slot or a cool-down) says what it
# waits for; `tick()` is called often enough that a cron log gets a line a minute.
QUIET = 50.0


class ProgressSink(EventSink, Protocol):
    """An event sink that shows a run as it goes and sums it up on `close`."""

    def close(self) -> None:
        """Stop any live display and print the final summary; idempotent."""
        ...

    def note(self, news: News) -> None:
        """Show `news` (a signal's acknowledgement) without breaking the view."""
        ...

    def tick(self) -> None:
        """Say what the run waits for, if nothing was said for `QUIET` seconds."""
        ...


class View(Protocol):
    """Opens the sink a run is shown in: it reads `clock`, and hands the news it
    is given to `notes` unless it draws them itself. `earlier`: the file's jobs that
    ended in earlier runs, by how they ended (`events.ENDED`), so that a
    resumed run's summary counts the whole file. `responses`: the run's answers
    by code, which the run counts (it keeps them for `status`), and `tally`: the
    run's counts per key, which the runner counts: a view shows these rather
    than count its own."""

    def __call__(
        self,
        *,
        clock: Clock,
        notes: Callable[[News], None],
        earlier: Mapping[Status, int] | None = None,
        responses: Responses | None = None,
        tally: RunTally | None = None,
    ) -> ProgressSink: ...
