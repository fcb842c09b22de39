"""Stopping aiokafka clients without losing a cancellation (DESIGN §9 shutdown; DECISIONS 300).

aiokafka's ``AIOKafkaClient.close()``, under every producer's, consumer's and admin
client's ``stop()``/``close()``, cancels its metadata task and awaits it with
``CancelledError`` suppressed. A cancellation of the task doing the close that arrives
during that await is delivered to that await and suppressed with it: the task goes on as
if it had never been cancelled. A follower cancelled while its read closed a fetcher (at
the end of every read, and at the idle follower's look at record 0 every 2 s) went on
following for ever, and whatever waited for it (a ``serve`` replica's term, a stop) waited
for ever too.

So a client is stopped by :func:`stop_client`: the stop runs as a task of its own and the
caller waits for it with ``asyncio.wait``, which never delivers the caller's cancellation
to what it waits for; a cancellation of the caller is raised at once and the stop goes on
by itself (it ends within the client's request timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["stop_client"]

#: Stops still running after their caller was cancelled (a task needs a strong reference).
_STOPPING: set[asyncio.Future[Any]] = set()


def _settle(task: asyncio.Future[Any]) -> None:
    """Forget a finished stop and mark its error as seen: a client being stopped has
    nothing more to say (a broker gone, a connection already closed)."""
    _STOPPING.discard(task)
    if not task.cancelled():
        task.exception()


async def stop_client(stopping: Awaitable[Any], *, within_s: float | None = None) -> bool:
    """Run ``stopping`` (an aiokafka client's ``close()`` or ``stop()``) and wait for its
    end, at most ``within_s`` (then it is cancelled); True when it ended by itself in time.

    Its errors are dropped. A cancellation of the caller is raised at once and never
    reaches aiokafka (see the module docstring); the stop is left to end by itself.
    """
    task = asyncio.ensure_future(stopping)
    _STOPPING.add(task)
    task.add_done_callback(_settle)
    done, _ = await asyncio.wait({task}, timeout=within_s)
    if done:
        return True
    task.cancel()
    await asyncio.wait({task})
    return False
