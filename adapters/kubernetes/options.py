"""The Kubernetes options of ``run`` (and ``serve``) (DESIGN §12): on the command
line (:func:`add_arguments`, :func:`check_arguments`) and as the typed
:class:`ClusterOptions` the adapter (:mod:`.cluster`) takes, built from the
parsed arguments at the command's edge.

Kept apart from the adapter so that building the command line does not import the
Kubernetes client.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

#: Quota sources (DESIGN §12); the collections each watches are in :mod:`.sources`.
SOURCES = ("quotaledger", "koordinator", "kueue", "volcano", "yunikorn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Kubernetes options of ``run``/``serve`` (DESIGN §12)."""
    group = parser.add_argument_group("Kubernetes (DESIGN §12)")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", metavar="PATH", help="watch the cluster of this kubeconfig")
    where.add_argument(
        "--in-cluster", action="store_true", help="watch the cluster this pod runs in"
    )
    group.add_argument(
        "--quota-source",
        choices=SOURCES,
        default="quotaledger",
        help="where quotas come from (default: the quotas.quotaledger.io CRD)",
    )
    group.add_argument(
        "--settings-configmap",
        metavar="NAMESPACE/NAME",
        default="quotaledger/quotaledger-settings",
        help="ConfigMap whose data keys are SettingsChanged fields",
    )
    group.add_argument(
        "--eviction-retry-for",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="retry 429/5xx evictions this long after the request (default 300)",
    )
    group.add_argument(
        "--lease-name", default="quotaledger", help="the Lease (default quotaledger)"
    )
    group.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long a Lease holds without renewal before another replica may take it"
        " (default 15)",
    )
    group.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the holder steps down when it could not renew for this long (default 10)",
    )
    group.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often replicas try to take or renew the Lease (default 2)",
    )
    group.add_argument(
        "--watch-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="server-side timeout of each watch request (default 300)",
    )


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """What a replica on a cluster runs with (DESIGN §12): where the cluster is, the
    engine's name and executor, the quota source and settings ConfigMap, the Lease
    timing and the watch timeout."""

    kubeconfig: str | None
    in_cluster: bool
    #: this replica's name: the Lease holder identity and the engine's instance
    instance: str
    #: ``kubernetes`` (the Eviction API), ``log``, or ``simulate``
    executor: str
    quota_source: str
    #: ``NAMESPACE/NAME``
    settings_configmap: str
    eviction_retry_for: float
    lease_name: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    watch_timeout: int
    #: records between snapshots of an engine built per term (``run``; ``serve``
    #: hands its own engine to every term)
    snapshot_every: int = 50_000

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, snapshot_every: int = 50_000) -> ClusterOptions:
        """The options of a parsed ``run``/``serve`` command line (:func:`add_arguments`,
        plus ``--instance`` and ``--executor``, which both commands have)."""
        return cls(
            kubeconfig=args.kubeconfig,
            in_cluster=args.in_cluster,
            instance=args.instance,
            executor=args.executor,
            quota_source=args.quota_source,
            settings_configmap=args.settings_configmap,
            eviction_retry_for=args.eviction_retry_for,
            lease_name=args.lease_name,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
            watch_timeout=args.watch_timeout,
            snapshot_every=snapshot_every,
        )


def on_cluster(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "kubeconfig", None) or getattr(args, "in_cluster", False))


def check_arguments(args: argparse.Namespace) -> str | None:
    """A user error in the Kubernetes options, or None."""
    if getattr(args, "executor", None) == "kubernetes" and not on_cluster(args):
        return "--executor kubernetes needs --kubeconfig PATH or --in-cluster"
    if not on_cluster(args):
        return None
    text = args.settings_configmap
    if text.count("/") != 1 or not all(text.split("/")):
        return f"--settings-configmap: expected NAMESPACE/NAME, got {text!r}"
    if args.eviction_retry_for < 0:
        return "--eviction-retry-for: must be >= 0"
    if not 0 < args.retry_period < args.renew_deadline < args.lease_duration:
        return "need 0 < --retry-period < --renew-deadline < --lease-duration"
    if args.watch_timeout < 1:
        return "--watch-timeout: must be >= 1"
    return None
