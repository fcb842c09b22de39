"""The HTTP interface of ``serve`` (DESIGN §11): API, metrics, the page.

Modules: :mod:`.server` (the ``Server``: follower or engine, the cluster
wiring, the HTTP app and the reads), :mod:`.stream` (the live feed of
``GET /v1/stream``), :mod:`.gate` (the fold gate between the follower and the
readers), :mod:`.metrics` (the Prometheus collector), :mod:`.command` (the
``serve`` command's arguments and entry point; no aiohttp import), ``page/``
(the static page served at ``/``).
"""
