"""Benchmark tooling (DESIGN §1: tooling, not the engine; docs/PERFORMANCE.md).

Nothing outside this package imports it except the ``bench`` command
(``adapters/cli/bench.py``), which imports only the suite asked for, when it
runs; tests may import it. Modules:

* :mod:`.workload` — the deterministic workload generator every suite folds;
* :mod:`.fold` — ``bench fold``: decode, fold, recompute, SQLite, replay and
  audit through the CLI, the state hash (measured in :mod:`.fold_measurements`);
* :mod:`.decide` — ``bench decide``: deadline-to-eviction latency, the
  follower's rate, ``simulate`` throughput;
* :mod:`.kafka` — ``bench kafka``: the Kafka ledger against plain aiokafka
  (and the tansu command line the tests start brokers with);
* :mod:`.k8s` — ``bench k8s``: the cluster watcher against the stand-in API
  server;
* :mod:`.standin` — the stand-in Kubernetes API server (NOT Kubernetes): used by
  ``bench k8s`` as a process and by the tests in-process; its objects and watches
  (:mod:`.standin_store`), requests (:mod:`.standin_requests`), discovery documents
  (:mod:`.standin_discovery`) and the benchmark's cluster (:mod:`.standin_bench`);
* :mod:`.serve` — the ``serve`` figures: the ``/metrics`` scrape
  (``python -m quotaledger.adapters.bench.serve scrape``) and the load the
  serve load test drives;
* the fault harness of ``bench faults``: :mod:`.faults` (the trials of the
  command, the summary), :mod:`.fault_plan` (options, fault kinds, the schedule
  drawn), :mod:`.fault_trial` (one trial in order) on :mod:`.fault_trial_state`,
  :mod:`.fault_injection`, :mod:`.fault_producers`, :mod:`.fault_verdict` (the
  end of a trial), :mod:`.fault_processes` (engine processes and their logs),
  :mod:`.fault_environment` (brokers, moto), :mod:`.fault_checks` (the checks)
  on :mod:`.fault_records` (the raw reads),
  :mod:`.fault_cluster` (the stand-in cluster around the engines),
  :mod:`.fault_proxy` (the TCP fault proxy), :mod:`.tansu` (the tansu broker and
  moto S3 processes, which the tests start too).
"""
