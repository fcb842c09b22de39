"""How work ends on a stop (DESIGN §9: SIGTERM/SIGINT stop any command within 2 s).

Two rules for work that waits on what the engine does not control (a ledger that does not
answer, a library that swallows a cancellation):

* :func:`unless_stopped` races the work against the stop event: once the stop is set the
  work is cancelled and the caller goes on (a claim, a catch-up held up by a slow or
  unreachable ledger must not hold up a stop; DECISIONS 228, 301);
* :func:`cancel_and_wait` cancels a task and waits for its end, cancelling it again while
  it goes on: one cancellation swallowed somewhere inside it (aiokafka's client close did,
  DECISIONS 300) must not leave it running, nor its caller waiting for it for ever.

Both wait with ``asyncio.wait``, which never hands the caller's own cancellation to what it
waits for, so a cancellation of the caller is raised, never swallowed (the ``with
suppress(CancelledError): await task`` idiom swallows one that arrives during that await).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["cancel_and_wait", "unless_stopped"]

T = TypeVar("T")

#: How long a cancelled task may go on before it is cancelled again.
AGAIN_S = 0.1


async def cancel_and_wait(task: asyncio.Future[Any], *, again_s: float = AGAIN_S) -> None:
    """Cancel ``task`` and return once it has ended, cancelling it again every ``again_s``
    while it goes on. An error it ended with (not its cancellation) is raised. A
    cancellation of the caller is raised at once, ``task`` cancelled once more."""
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=again_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
    if not task.cancelled() and (error := task.exception()) is not None:
        raise error


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event | None) -> T | None:
    """``work``'s result, or None once ``stop`` is set first (``work`` then cancelled, and
    waited for: :func:`cancel_and_wait`). Without ``stop``, just ``work``'s result."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return await task
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await cancel_and_wait(task)
        raise
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    await cancel_and_wait(task)
    return None
