"""The Kubernetes adapter (DESIGN §12): watcher, quota sources, eviction executor, Lease
leader election, built on the kubernetes-asyncio client.

Modules: :mod:`.translate` (objects → facts, pure), :mod:`.settings` (the settings ConfigMap),
:mod:`.sources` (quota sources), :mod:`.reflector` (list + watch of one collection),
:mod:`.watcher` (the cluster watcher), :mod:`.executor` (policy/v1 evictions),
:mod:`.lease` (coordination.k8s.io/v1 Lease), :mod:`.cluster` (client set-up and the
``run``/``serve`` wiring).
"""
