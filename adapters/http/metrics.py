"""Prometheus metrics of a running ``serve`` (DESIGN §11).

One custom collector, :class:`StateCollector`, reads the projected state at
scrape time (per-event gauge updates would cost the fold, DESIGN §7). Values are
in Prometheus base units: cpu in cores (the state holds millicores), every other
resource as held (memory in bytes, counts as counts).

Counters and histograms that the state does not hold (preemption and eviction
outcomes, fold time, decision latency) are kept by :class:`FoldStatistics`,
which watches every batch the follower folds (:mod:`.gate`); they count
from the start of this process, as Prometheus counters do (a restart is a
counter reset). The collector exports them too, so there is one collector and
one registry per server, and no module-level state.

The collector must be called with the fold gate held and the state settled: it
runs in a worker thread while the event loop goes on serving.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from quotaledger.engine.core import timers
from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.ledger import Record
from quotaledger.events.model import (
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    PreemptionFinished,
    PreemptionStarted,
)
from quotaledger.projections.available import reported_available
from quotaledger.projections.fair_share import fair_shares, namespace_usage
from quotaledger.projections.resources import RL
from quotaledger.projections.state import ProjectedState

#: prometheus-client's Go-style float formatting (untyped upstream).
go_float = cast(Callable[[float], str], floatToGoString)

#: Decision kinds the statistics decode (every other record is skipped unread).
_WATCHED = frozenset(
    {
        "PreemptionStarted",
        "PreemptionFinished",
        "EvictionRequested",
        "EvictionSucceeded",
        "EvictionFailed",
    }
)

FOLD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def base_units(resource: str, amount: int) -> float:
    """Canonical integer → Prometheus base unit: millicores → cores."""
    return amount / 1000 if resource == "cpu" else float(amount)


@dataclass(slots=True)
class Histogram:
    """Cumulative bucket counts and a sum (exported as a Prometheus histogram)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((repr(bound), running))
        running += self.counts[-1]
        buckets.append(("+Inf", running))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.total)


@dataclass(slots=True)
class FoldStatistics:
    """Counters and histograms taken from the folded records (see module docstring).

    * ``fold_seconds``: time the follower spent applying one batch;
    * ``decision_latency``: for each accepted ``PreemptionStarted``, its record's
      ts minus the deadline of the timer that fired it (both ledger times);
    * ``preemptions[(cause, outcome)]``: finished preemptions;
    * ``evictions[outcome]``: ``requested``, ``succeeded``, ``failed``.
    """

    fold_seconds: Histogram = field(default_factory=lambda: Histogram(FOLD_BUCKETS))
    decision_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    preemptions: Counter[tuple[str, str]] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    _causes: dict[str, str] = field(default_factory=dict)
    _deadlines: dict[int, int] = field(default_factory=dict)

    def before_fold(self, batch: Sequence[Record], state: ProjectedState) -> None:
        """Remember, from the state before the batch, what its decisions answer."""
        for record in batch:
            kind = peek_kind(record.payload)
            if kind == "PreemptionStarted":
                event = _decode(record)
                if isinstance(event, PreemptionStarted):
                    for timer in timers(state):
                        if timer.queue == event.queue and timer.cause == event.cause:
                            self._deadlines[record.offset] = timer.deadline
                            break
            elif kind == "PreemptionFinished":
                event = _decode(record)
                if isinstance(event, PreemptionFinished):
                    running = state.preemptions.get(event.preemption_id)
                    if running is not None:
                        self._causes.setdefault(event.preemption_id, running.cause)

    def after_fold(self, batch: Sequence[Record], state: ProjectedState, seconds: float) -> None:
        """Count what the projection accepted of ``batch``."""
        self.fold_seconds.observe(seconds)
        if not batch:
            return
        first = batch[0].offset
        refused = set()
        for rejection in reversed(state.rejected):
            if rejection.offset < first:
                break
            refused.add(rejection.offset)
        for record in batch:
            if record.offset in refused or peek_kind(record.payload) not in _WATCHED:
                continue
            event = _decode(record)
            if isinstance(event, PreemptionStarted):
                self._causes[event.preemption_id] = event.cause
                deadline = self._deadlines.pop(record.offset, None)
                if deadline is not None:
                    self.decision_latency.observe(max(0, record.ts - deadline) / 1000)
            elif isinstance(event, PreemptionFinished):
                cause = self._causes.pop(event.preemption_id, "unknown")
                self.preemptions[(cause, event.outcome)] += 1
            elif isinstance(event, EvictionRequested):
                self.evictions["requested"] += 1
            elif isinstance(event, EvictionSucceeded):
                self.evictions["succeeded"] += 1
            elif isinstance(event, EvictionFailed):
                self.evictions["failed"] += 1
        self._deadlines.clear()


def _decode(record: Record) -> object:
    try:
        return decode_event(record.payload)
    except EventError:
        return None


@dataclass(slots=True)
class LedgerPosition:
    """The ledger tail as last read (``last_offset``), for the lag gauge."""

    tail: int = -1


class StateCollector(Collector):
    """Every ``quotaledger_*`` metric of DESIGN §11, read at scrape time."""

    def __init__(
        self,
        state: Callable[[], ProjectedState],
        statistics: FoldStatistics,
        position: LedgerPosition,
        epoch: Callable[[], int],
        version: str,
    ) -> None:
        self._state = state
        self._statistics = statistics
        self._position = position
        self._epoch = epoch
        self._version = version

    def collect(self) -> Iterator[Metric]:
        for part in self._parts():
            yield part.metric() if isinstance(part, Series) else part

    def render(self) -> bytes:
        """The text format of :meth:`collect`, byte for byte what
        ``prometheus_client.generate_latest`` writes for it (tests check), about
        three times faster at 10k quotas: the big gauge families are written from
        their rows, and numbers are formatted once per distinct value."""
        numbers: dict[float, str] = {}
        out: list[str] = []
        for part in self._parts():
            if isinstance(part, Series):
                out.append(f"# HELP {part.name} {_help(part.documentation)}\n")
                out.append(f"# TYPE {part.name} gauge\n")
                head = part.name + "{"
                for _, text, value in part.rows:
                    number = numbers.get(value)
                    if number is None:
                        number = numbers[value] = go_float(value)
                    out.append(f"{head}{text}}} {number}\n")
            else:
                _write_metric(part, out, numbers)
        return "".join(out).encode()

    def _parts(self) -> Iterator[Metric | Series]:
        state = self._state()
        yield from _quota_series(state)
        yield from _namespace_series(state)
        yield from _cluster_families(state)
        yield from self._decision_families(state)
        yield from self._ledger_families(state)

    def _decision_families(self, state: ProjectedState) -> Iterator[Metric]:
        stats = self._statistics
        preemptions = CounterMetricFamily(
            "quotaledger_preemptions",
            "Preemptions finished since this server started, by cause and outcome",
            labels=["cause", "outcome"],
        )
        for (cause, outcome), count in sorted(stats.preemptions.items()):
            preemptions.add_metric([cause, outcome], count)
        yield preemptions
        evictions = CounterMetricFamily(
            "quotaledger_evictions",
            "Evictions since this server started: requested, succeeded, failed",
            labels=["outcome"],
        )
        for outcome in ("requested", "succeeded", "failed"):
            evictions.add_metric([outcome], stats.evictions.get(outcome, 0))
        yield evictions
        running = GaugeMetricFamily(
            "quotaledger_preemption_running",
            "1 for each queue occupied by a running preemption",
            labels=["queue"],
        )
        for queue in sorted(state.occupied):
            running.add_metric([queue], 1)
        yield running
        deadlines: dict[str, int] = {}
        for timer in timers(state):
            deadlines.setdefault(timer.queue, timer.deadline)
        timer_family = GaugeMetricFamily(
            "quotaledger_timer_deadline_seconds",
            "Earliest armed reconciler deadline per queue (unix seconds)",
            labels=["queue"],
        )
        for queue in sorted(deadlines):
            timer_family.add_metric([queue], deadlines[queue] / 1000)
        yield timer_family
        rejected = CounterMetricFamily(
            "quotaledger_rejected_facts",
            "Rejected facts and refused decisions in the ledger, by kind",
            labels=["kind"],
        )
        for kind, count in sorted(Counter(r.kind or "unknown" for r in state.rejected).items()):
            rejected.add_metric([kind], count)
        yield rejected
        yield stats.fold_seconds.family(
            "quotaledger_fold_seconds", "Time to fold one batch of ledger records"
        )
        yield stats.decision_latency.family(
            "quotaledger_decision_latency_seconds",
            "Timer deadline to the PreemptionStarted record that answered it",
        )

    def _ledger_families(self, state: ProjectedState) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "quotaledger_ledger_offset", "Offset of the last folded record", value=state.offset
        )
        lag = max(0, self._position.tail - state.offset)
        yield GaugeMetricFamily(
            "quotaledger_ledger_lag_records", "Records in the ledger not folded yet", value=lag
        )
        yield GaugeMetricFamily(
            "quotaledger_leader_epoch", "Newest leader epoch in the ledger", value=self._epoch()
        )
        info = GaugeMetricFamily(
            "quotaledger_build_info", "quotaledger version", labels=["version"]
        )
        info.add_metric([self._version], 1)
        yield info


_QUOTA_METRICS = (
    ("min", "Configured min (guaranteed)"),
    ("max", "Configured max (absent: unlimited)"),
    ("effective_min", "Min after min scaling"),
    ("request", "Request (DESIGN §5)"),
    ("limited_request", "Request capped by max and borrowing limit"),
    ("used", "Requests of bound active pods"),
    ("runtime", "Runtime entitlement (weighted water-filling)"),
    ("available", "Admission headroom (Kueue KEP-79)"),
)


@dataclass(slots=True)
class Series:
    """A gauge family of many series kept as rows: label values, the label text
    as the exposition format writes it (names sorted, values escaped), the value.

    The per-quota families hold ~200k series at 10k quotas; rows cost a fraction
    of prometheus-client ``Sample`` objects, and :meth:`metric` builds those only
    for a registry consumer that asks (docs/PERFORMANCE.md)."""

    name: str
    documentation: str
    label_names: tuple[str, ...]
    rows: list[tuple[tuple[str, ...], str, float]] = field(default_factory=list)

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=list(self.label_names))
        names = self.label_names
        family.samples = [
            Sample(self.name, dict(zip(names, values, strict=True)), value, None, None)
            for values, _, value in self.rows
        ]
        return family


def escape_label(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _quota_series(state: ProjectedState) -> list[Series]:
    series = {
        name: Series(f"quotaledger_quota_{name}", text, ("quota", "resource"))
        for name, text in _QUOTA_METRICS
    }
    rows = {name: family.rows for name, family in series.items()}
    memo: dict[str, RL] = {}
    labels: dict[str, str] = {}  # resource -> label text, per quota
    for name in sorted(state.quotas):
        node = state.quotas[name]
        config = node.config
        quoted = escape_label(name)
        labels.clear()
        values: tuple[tuple[str, RL | None], ...] = (
            ("min", config.min),
            ("max", config.max),
            ("effective_min", node.effective_min),
            ("request", node.request),
            ("limited_request", node.limited_request),
            ("used", node.used),
            ("runtime", node.runtime),
            ("available", reported_available(state, name, memo)),
        )
        for metric, amounts in values:
            if not amounts:
                continue
            out = rows[metric]
            for resource in sorted(amounts):
                text = labels.get(resource)
                if text is None:
                    text = labels[resource] = (
                        f'quota="{quoted}",resource="{escape_label(resource)}"'
                    )
                amount = amounts[resource]
                out.append(((name, resource), text, amount / 1000 if resource == "cpu" else amount))
    return list(series.values())


def _namespace_series(state: ProjectedState) -> list[Series]:
    names = ("namespace", "quota", "resource")
    request = Series(
        "quotaledger_namespace_request", "Namespace request inside a leaf quota", names
    )
    used = Series("quotaledger_namespace_used", "Namespace used inside a leaf quota", names)
    share = Series(
        "quotaledger_namespace_fair_share", "Namespace fair share of the quota's runtime", names
    )
    for name in sorted(state.quotas):
        node = state.quotas[name]
        if not node.pods:
            continue
        usage = namespace_usage(state, node)
        shares = fair_shares(node, usage, state.namespace_weights)
        quoted = escape_label(name)
        for ns, entry in usage.items():
            head = f'namespace="{escape_label(ns)}",quota="{quoted}",resource="'
            for family, amounts in (
                (request, entry.request),
                (used, entry.used),
                (share, shares[ns]),
            ):
                out = family.rows
                for resource in sorted(amounts):
                    amount = amounts[resource]
                    if amount:
                        value = amount / 1000 if resource == "cpu" else amount
                        text = head + escape_label(resource) + '"'
                        out.append(((ns, name, resource), text, value))
    return [request, used, share]


def _cluster_families(state: ProjectedState) -> Iterator[Metric]:
    allocatable = GaugeMetricFamily(
        "quotaledger_cluster_allocatable", "Sum of node allocatable", labels=["resource"]
    )
    for resource in sorted(state.allocatable):
        allocatable.add_metric([resource], base_units(resource, state.allocatable[resource]))
    yield allocatable
    total = GaugeMetricFamily(
        "quotaledger_cluster_total",
        "Allocatable minus the used of system and default (what root's children share)",
        labels=["resource"],
    )
    for resource in sorted(state.cluster_total):
        total.add_metric([resource], base_units(resource, state.cluster_total[resource]))
    yield total


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _write_metric(metric: Metric, out: list[str], numbers: dict[float, str]) -> None:
    """One family in the text format, as ``generate_latest`` writes gauges,
    counters and histograms (label names sorted)."""
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    out.append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} {metric.type}\n")
    for sample in metric.samples:
        number = numbers.get(sample.value)
        if number is None:
            number = numbers[sample.value] = go_float(sample.value)
        if sample.labels:
            labels = ",".join(
                f'{key}="{escape_label(text)}"' for key, text in sorted(sample.labels.items())
            )
            out.append(f"{sample.name}{{{labels}}} {number}\n")
        else:
            out.append(f"{sample.name} {number}\n")
