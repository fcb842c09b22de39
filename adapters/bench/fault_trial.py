"""One trial of ``quotaledger bench faults``, told in order (DECISIONS 220-229): the
stand-in API server and the ledger set up, 2-3 engines started until a Lease holder has put
the cluster into the ledger; then side by side the controller's scheduler, the scenario's
workload, the outside producers (:mod:`.fault_producers`) and the faults
(:mod:`.fault_injection`); then every link healed, quiescence awaited, every engine stopped
at once with SIGTERM (each must exit cleanly within the bound, DESIGN §9, DECISIONS 180,
225), and the checks (:mod:`.fault_verdict`). An engine that exits by itself is a violation
and is started again (:meth:`Trial._supervise`). What the trial holds is
:class:`.fault_trial_state.TrialState`.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time

from quotaledger.engine.core import timers
from quotaledger.events.ledger import LedgerError

from ..ledgers.url import open_ledger
from .fault_cluster import Scenario, apply_event, draw_scenario, now_ms
from .fault_injection import apply_faults, heal
from .fault_plan import TrialResult
from .fault_processes import MISSING, URL, EngineSlot, refused_at_start, tail
from .fault_producers import ingest_producer, kafka_producer
from .fault_proxy import FaultProxy
from .fault_records import RawRecord, fold
from .fault_trial_state import TrialState
from .fault_verdict import check, check_logs


class Trial(TrialState):
    """One trial on its environment: :meth:`run` returns its :class:`TrialResult`."""

    # ---------------------------------------------------------- the run

    async def run(self) -> TrialResult:
        self.started = time.monotonic()
        self.started_ms = now_ms()
        await self.server.start()
        try:
            async with asyncio.TaskGroup() as group:
                self.group = group
                try:
                    async with asyncio.timeout(
                        self.options.workload_s + self.options.settle_timeout_s + 120
                    ):
                        await self._run()
                except TimeoutError:
                    self.violate("no-quiescence", "the trial did not end within its hang guard")
                except Exception as exc:  # a harness bug: said, never hidden
                    self.violate("harness-error", f"{type(exc).__name__}: {exc}")
                finally:
                    if self.tap_task is not None:
                        self.tap_task.cancel()
        finally:
            for slot in self.slots:
                if slot.alive():
                    slot.resume()
                    await slot.kill()
                await slot.proxy.close()
            await self.server.stop()
        self.result.seconds = time.monotonic() - self.started
        holder: str | None = "-"
        for ms, who in self.server.lease_writes:
            if who != holder:
                holder = who
                self.result.fault_log.append(
                    f"{(ms - self.started_ms) / 1000:7.2f} lease held by {who}"
                )
        self.result.fault_log.sort(key=lambda line: float(line.split()[0]))
        return self.result

    async def _run(self) -> None:
        rng = self.rng
        scenario = draw_scenario(rng, self.cluster, self.options.workload_s)
        self.server.put(
            "configmaps",
            {
                "metadata": {"name": "quotaledger-settings", "namespace": "quotaledger"},
                "data": scenario.settings,
            },
        )
        self.server.refuse_share = (
            scenario.eviction_refuse
            if self.options.refuse_share is None
            else self.options.refuse_share
        )
        self.server.error_share = scenario.eviction_error
        self.server.retry_after = scenario.retry_after
        self.server.on_evicted = self.cluster.evicted
        await self._create_ledger()
        if self.env.backend == "kafka":  # only now: a fetch of a missing topic creates it
            self.tap_task = self.group.create_task(self.tap.follow())
        engines = rng.choice([2, 2, 3])
        for index in range(engines):
            await self._add_slot(index, scenario, rng.choice(["stop", "fill"]))
        for slot in self.slots:
            await slot.start(self.instance_name(slot, new=True))
        if not await self._wait_ready():
            return
        self.note(f"ready: {engines} engines, lease held by {self.server.holder()}")
        faults = self.faults
        if self.broker is not None:
            self.note(f"broker storage: {self.broker.storage}")
        stop_scheduler = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.cluster.run_scheduler(stop_scheduler))
            supervisor = group.create_task(self._supervise())
            group.create_task(self._workload(scenario))
            producers = [
                group.create_task(ingest_producer(self, i))
                for i in range(rng.randint(1, self.options.ingest_producers))
            ]
            if self.env.backend == "kafka" and rng.random() < 0.7:
                producers.append(group.create_task(kafka_producer(self)))
            fault_task = group.create_task(apply_faults(self, faults))
            await asyncio.sleep(self.options.workload_s)
            self.cluster.recreate = False
            await fault_task
            await asyncio.gather(*producers)
            await heal(self)
            settled = await self._settle()
            supervisor.cancel()
            stop_scheduler.set()
        await self._stop_engines()
        if settled is not None:
            await check(self, settled)
        else:  # what the logs say is checked all the same
            await check_logs(self, None)

    async def _create_ledger(self) -> None:
        """Create the trial's ledger. A shared broker another trial beside this one is
        restarting (``--parallel``) cannot be reached for a moment: wait for it (up to
        30 s) as the engines do, rather than report the trial as a harness error."""
        url = (
            str(self.path)
            if self.env.backend == "sqlite"
            else f"kafka://{self.bootstrap}/{self.topic}"
        )
        deadline = time.monotonic() + 30.0
        while True:
            if self.broker is not None:
                async with self.broker.lock:  # not while a restart holds it down
                    pass
            try:
                ledger = await open_ledger(url, create=True)
            except LedgerError as exc:
                if "cannot connect" not in str(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
                continue
            await ledger.close()
            return

    async def _add_slot(self, index: int, scenario: Scenario, gaps: str) -> None:
        proxy = await FaultProxy(
            "127.0.0.1",
            int(self.server.url.rsplit(":", 1)[1]),
            name=f"e{index}",
            http=True,
            registry=self.registry,
            rng=random.Random(self.rng.random()),
        ).start()
        standin_url = self.server.url
        self.server.url = f"http://127.0.0.1:{proxy.port}"
        kubeconfig = self.server.kubeconfig(self.dir / f"e{index}.kubeconfig")
        self.server.url = standin_url
        o = self.options
        command = [
            *o.engine_command,
            "run",
            URL,
            "--kubeconfig",
            str(kubeconfig),
            "--executor",
            "kubernetes",
            "--lease-duration",
            str(o.lease_duration_s),
            "--renew-deadline",
            str(o.renew_deadline_s),
            "--retry-period",
            str(o.retry_period_s),
            "--watch-timeout",
            "5",
            "--eviction-retry-for",
            str(scenario.eviction_retry_for),
            "--digest-every",
            str(self.rng.choice([25, 100, 10_000])),
            "--snapshot-every",
            str(self.rng.choice([40, 150, 50_000])),
        ]
        if self.env.backend == "kafka" and self.rng.random() < 0.5:
            command += ["--snapshots", str(self.dir / f"e{index}-snapshots.db")]
        urls = {mode: self.engine_url(mode) for mode in ("stop", "fill")}
        self.slots.append(EngineSlot(index, proxy, kubeconfig, self.dir, command, urls, gaps))

    async def _wait_ready(self) -> bool:
        """Until a Lease holder's watcher has put the cluster into the ledger."""
        pods = {p["metadata"]["uid"] for p in self.cluster.pods()}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            for slot in self.slots:
                if slot.alive():
                    continue
                code = slot.proc.returncode if slot.proc else None
                if refused_at_start(code, slot.incarnations[-1].stderr):
                    # its broker unreachable as it started (a trial beside this one
                    # restarting the shared broker): a clear refusal (DECISIONS 227);
                    # started again, as the supervisor does later on
                    self.result.stats["engine starts refused at connect"] += 1
                    await slot.start(self.instance_name(slot, new=True))
                    continue
                self.violate(
                    "process-exit",
                    f"engine {slot.instance} exited {code if code is not None else '?'}"
                    f" while starting: {tail(slot.incarnations[-1].stderr)}",
                )
                return False
            if self.server.holder() is None:
                continue
            projection = fold(await self.records())
            state = projection.state
            if pods <= set(state.pods) and {"p", "a", "b", "c"} <= set(state.quotas):
                return True
        self.violate("no-quiescence", "the engines did not put the cluster into the ledger in 90 s")
        return False

    # ---------------------------------------------------------- workload

    async def _workload(self, scenario: Scenario) -> None:
        start = time.monotonic()
        for at_s, action, params in scenario.events:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            self.note(apply_event(self.cluster, self.cluster.rng, action, params))

    # ---------------------------------------------------------- engines

    async def _supervise(self) -> None:
        """An engine that exits by itself is a violation; it is started again."""
        while True:
            await asyncio.sleep(0.2)
            for slot in self.slots:
                proc = slot.proc
                if proc is None or proc.returncode is None or slot.incarnations[-1].expected_end:
                    continue
                incarnation = slot.incarnations[-1]
                incarnation.ended_ms = now_ms()
                text = tail(incarnation.stderr)
                if refused_at_start(proc.returncode, incarnation.stderr):
                    # its broker unreachable as it started (a restart or a cut, maybe a
                    # trial's beside it): a clear refusal, as for ingest (DECISIONS 227)
                    self.result.stats["engine starts refused at connect"] += 1
                else:
                    self.exited(f"engine {incarnation.instance}", proc.returncode, text)
                if MISSING.search(text) is not None:
                    slot.gaps = "fill"  # as an operator would, once told of a lost write
                self.note(f"{incarnation.instance} exited {proc.returncode}; restarting")
                await slot.start(self.instance_name(slot, new=True))

    # ---------------------------------------------------------- quiescence and stop

    async def _settle(self) -> list[RawRecord] | None:
        """Wait until nothing runs and nothing is to come; the records then."""
        deadline = time.monotonic() + self.options.settle_timeout_s
        grace = self.options.deadline_grace_ms
        last: tuple[int, int] = (-1, 0)
        why = "?"
        told = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            if time.monotonic() - told > 10:
                told = time.monotonic()
                self.note(f"not quiet yet: {why}")
            records = await self.records()
            state = fold(records).state
            now = now_ms()
            tail_offset = records[-1].offset if records else -1
            if tail_offset != last[0]:
                last = (tail_offset, now)
            cluster = {
                p["metadata"]["uid"]: (p["status"]["phase"], p["spec"].get("nodeName"))
                for p in self.cluster.pods()
            }
            mirrored = {
                uid: (pod.phase, pod.node)
                for uid, pod in state.pods.items()
                if pod.phase in ("Pending", "Running")
            }
            if state.preemptions:
                why = f"preemptions running: {sorted(state.preemptions)}"
            elif any(e.outcome is None for e in state.evictions.values()):
                outstanding = sorted(e for e, r in state.evictions.items() if r.outcome is None)
                why = f"evictions outstanding: {outstanding}"
            elif state.settings.quota_preemption_enabled and state.decrease_deadlines:
                # to come, or passed and not yet answered: the leader may still be
                # catching up (a slow broker); one left armed for good ends the wait at
                # the settle timeout and is reported (armed-deadline)
                why = f"deadlines armed: {state.decrease_deadlines}"
            elif soon := [t for t in timers(state) if t.deadline > now - grace]:
                # an overuse or reclaim deadline to come (or just passed): its engine has
                # yet to decide on it
                why = f"timers to come: {[(t.cause, t.queue, t.deadline) for t in soon]}"
            elif self.env.backend == "kafka" and not self.tap.caught_up:
                why = f"the raw reads lag the broker (high watermark {self.tap.highwater})"
            elif cluster != mirrored:
                why = "the ledger does not mirror the cluster yet"
            elif self.server.holder() is None:
                why = "no Lease holder"
            elif state.leader_instance != self.server.holder():
                why = f"the Lease holder {self.server.holder()} has not claimed its epoch yet"
            elif now - last[1] < 1500:
                why = "the tail still moves"
            else:
                return records
        self.violate(
            "no-quiescence", f"not quiet after {self.options.settle_timeout_s:.0f} s: {why}"
        )
        return None

    async def _stop_engines(self) -> None:
        """SIGTERM every engine at once: each must exit 0 (or, stopped before its handlers were in
        place, by the signal itself or with 143 and ``stopped by SIGTERM``), spending less
        than the bound in CPU and in wall time less its waits for a CPU."""
        bound = self.options.stop_bound_s
        # all at once: an engine left running while another stops (slowly, on a loaded
        # machine) may still decide, and its decision then goes unfinished
        instances = [slot.instance for slot in self.slots]
        stops = await asyncio.gather(*(slot.terminate(60.0) for slot in self.slots))
        for slot, instance, stopped in zip(self.slots, instances, stops, strict=True):
            text = tail(slot.incarnations[-1].stderr)
            self.note(
                f"{instance}: SIGTERM -> exit {stopped.code} in {stopped.wall_s:.2f} s"
                f" ({stopped.cpu_s:.2f} s CPU, {stopped.waited_s:.2f} s waiting for one)"
            )
            stats = self.result.stats
            stats["stops"] += 1
            for key, value in (
                ("stop ms max", stopped.wall_s),
                ("stop own ms max", stopped.own_s),
                ("stop cpu ms max", stopped.cpu_s),
            ):
                stats[key] = max(stats[key], round(value * 1000))
            clean = stopped.code in (0, -signal.SIGTERM) or (
                stopped.code == 128 + signal.SIGTERM and "stopped by SIGTERM" in text
            )
            missing = MISSING.search(text)
            if stopped.code == 2 and missing is not None:
                # it met a missing offset as it stopped: judged at the end like any stop
                # at one (a broker-lost write with gaps=stop is designed, DECISIONS 224)
                self.stopped_at_holes.append(
                    (f"engine {instance} (at its SIGTERM)", int(missing.group(1)), text)
                )
                clean = True
            slow = stopped.cpu_s >= bound or stopped.own_s >= bound + 0.5
            if not clean or slow:
                self.violate(
                    "unclean-stop",
                    f"engine {instance}: SIGTERM -> exit {stopped.code} after"
                    f" {stopped.wall_s:.2f} s ({stopped.cpu_s:.2f} s CPU,"
                    f" {stopped.waited_s:.2f} s waiting for a CPU): {text}",
                )
