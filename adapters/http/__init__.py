"""The HTTP interface of ``serve`` (DESIGN §11): API, metrics, the page.

Modules, each importing only those listed before it:

* :mod:`.options` — ``ServeOptions`` and ``ServeError`` (no aiohttp import);
* :mod:`.documents` — the JSON answers and the error body/middleware;
* :mod:`.requests` — request bodies (size limits, NDJSON lines), query params;
* :mod:`.gate` — the fold gate between the follower and the readers;
* :mod:`.metrics` — the Prometheus collector and the fold statistics;
* :mod:`.stream` — the live feed of ``GET /v1/stream`` and its events;
* :mod:`.routes` — the handlers;
* :mod:`.server` — the ``Server``: follower or engine (on a cluster, while
  holding the Lease), the app, the gated reads; and ``serve()``;
* :mod:`.command` — the ``serve`` command's arguments and entry point (it
  imports the server only when the command runs, so ``--help`` stays fast);
* ``page/`` — the static page served at ``/``.
"""
