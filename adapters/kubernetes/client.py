"""Connecting to the API server with kubernetes-asyncio (DESIGN §12).

``--kubeconfig PATH`` uses the file's current context (its namespace, else ``quotaledger``,
is the engine's namespace for the Lease); ``--in-cluster`` uses the pod's service account
and the pod's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "quotaledger"


class ClusterConfigError(ValueError):
    """The kubeconfig or in-cluster environment cannot be used (a user error)."""


@dataclass
class Cluster:
    """An ApiClient and the typed APIs the adapter uses, plus the engine's namespace."""

    api: client.ApiClient
    namespace: str

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def coordination(self) -> Any:
        return client.CoordinationV1Api(self.api)

    async def close(self) -> None:
        await self.api.close()


async def connect(kubeconfig: str | None, in_cluster: bool) -> Cluster:
    """The cluster named by ``--kubeconfig`` or ``--in-cluster`` (exactly one)."""
    configuration = client.Configuration()
    if in_cluster:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise ClusterConfigError(f"--in-cluster: {exc}") from None
        try:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
        except OSError:
            namespace = DEFAULT_NAMESPACE
    else:
        if kubeconfig is None:
            raise ClusterConfigError("give --kubeconfig PATH or --in-cluster")
        if not Path(kubeconfig).is_file():
            raise ClusterConfigError(f"--kubeconfig: {kubeconfig}: no such file")
        try:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except (config.ConfigException, ValueError, KeyError, TypeError) as exc:
            raise ClusterConfigError(f"--kubeconfig: {kubeconfig}: {exc}") from None
        context = (active or {}).get("context") or {}
        namespace = context.get("namespace") or DEFAULT_NAMESPACE
    return Cluster(client.ApiClient(configuration), namespace)
