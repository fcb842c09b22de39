"""The faults of a ``quotaledger bench faults`` trial, applied at the times its plan drew
(:func:`.fault_plan.draw_faults`; DECISIONS 220-229): SIGKILL of an engine (the Lease holder
more often than not) and a restart under the same or a new instance name; SIGSTOP of the
Lease holder past its Lease, at once or with a refused eviction pending, then SIGCONT; a
delay, stall or cut on an engine's link to the API server or on the broker's link; each
fetch's first record batch hidden for a while (a later batch readable first, DECISIONS 200);
a broker restart. :func:`heal` ends them all once the workload is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence

from .fault_cluster import now_ms
from .fault_proxy import FaultProxy
from .fault_trial_state import TrialState


async def apply_faults(trial: TrialState, plan: Sequence[tuple[float, str]]) -> None:
    """Each fault of ``plan`` at its time (seconds from now), counted as drawn, and as
    applied unless it was not applicable then (e.g. no Lease holder to pause)."""
    start = time.monotonic()
    for at_s, kind in plan:
        await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
        trial.result.faults[f"{kind} drawn"] += 1
        began = time.monotonic()
        what = await apply_fault(trial, kind)
        if what is not None:
            trial.result.faults[kind] += 1
            trial.note(f"fault {kind}: {what}", began)
        else:
            trial.note(f"fault {kind}: not applicable now", began)


async def apply_fault(trial: TrialState, kind: str) -> str | None:
    """One fault of ``kind``, now: what was done, in words, or None if nothing could be."""
    rng = trial.rng
    live = [s for s in trial.slots if s.alive() and not s.paused]
    if kind == "kill":
        leader = trial.leader_slot()
        slot = (
            leader
            if leader is not None and rng.random() < 0.6
            else (rng.choice(live) if live else None)
        )
        if slot is None:
            return None
        victim = slot.instance
        await slot.kill()
        down_s = rng.uniform(0.0, 1.0)
        await asyncio.sleep(down_s)
        await slot.start(trial.instance_name(slot, new=rng.random() < 0.5))
        return f"SIGKILL {victim}, restarted as {slot.instance} after {down_s:.2f} s"
    if kind == "pause":
        slot = trial.leader_slot()
        if slot is None:
            await asyncio.sleep(1.0)
            slot = trial.leader_slot()
        if slot is None:
            return None
        how = "at once"
        if rng.random() < trial.options.pause_when_refused:  # with a retry pending
            event = trial.server.refused.setdefault(slot.name, asyncio.Event())
            event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.5):
                    await event.wait()
                    how = "after a refused eviction"
        if not slot.alive() or slot.instance != trial.server.holder():
            return None
        pause_s = trial.options.lease_duration_s + rng.uniform(*trial.options.pause_extra_s)
        instance = slot.instance or "?"
        stopped = now_ms()
        slot.pause()
        await asyncio.sleep(pause_s)
        slot.resume()
        trial.pauses.append((slot.name, instance, stopped, now_ms()))
        return (
            f"SIGSTOP {instance} ({how}) at {(stopped - trial.started_ms) / 1000:.2f}"
            f" for {pause_s:.2f} s, then SIGCONT"
        )
    if kind.startswith("api-"):
        if not trial.slots:
            return None
        slot = trial.leader_slot() if rng.random() < 0.6 else None
        slot = slot or rng.choice(trial.slots)
        return link_fault(rng, kind[4:], slot.proxy, slot.instance or slot.name)
    if kind.startswith("broker-") and trial.broker is not None:
        if kind == "broker-restart":
            return await trial.broker.restart(rng)
        if kind == "broker-reorder":
            return await trial.broker.reorder(rng, trial.options.gap_patience_s, trial.result)
        return link_fault(rng, kind[7:], trial.broker.proxy, "broker")
    return None


def link_fault(rng: random.Random, fault: str, proxy: FaultProxy, who: str) -> str:
    """A delay, a stall or a cut (``fault``) on one proxied link, in words."""
    if fault == "delay":
        low = rng.uniform(0.005, 0.05)
        high = low + rng.uniform(0.01, 0.3)
        for_s = rng.uniform(1.0, 3.0)
        proxy.delay(low, high, for_s)
        return f"{who} link: each chunk held {low:.3f}-{high:.3f} s for {for_s:.1f} s"
    if fault == "stall":
        for_s = rng.uniform(0.3, 2.5)
        proxy.stall(for_s)
        return f"{who} link stalled for {for_s:.2f} s"
    share = 1.0 if who != "broker" else rng.uniform(0.3, 1.0)
    cut = proxy.cut(share)
    return f"{who} link: {cut} connections cut mid-response"


async def heal(trial: TrialState) -> None:
    """Every link healed, every paused engine resumed, the broker up."""
    for slot in trial.slots:
        slot.proxy.heal()
        if slot.paused:
            slot.resume()
    if trial.broker is not None:
        trial.broker.proxy.heal()
        await trial.broker.ensure_up()
