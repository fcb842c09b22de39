"""Ledger backends (DESIGN §3, §10): one interface, :class:`quotaledger.events.ledger.Ledger`.

* :mod:`.url`: a LEDGER argument parsed and opened (the one opener of any ledger URL);
* :mod:`.sources`: a ledger's records, or a JSONL file's, for ``audit``, ``whatif`` and ``replay``;
* :mod:`.jsonl`: JSONL files of events;
* :mod:`.memory`: the contract kept in a list (tests and tools);
* :mod:`.sqlite`: the embedded default, one file;
* :mod:`.kafka`: one partition of a Kafka topic, and the ``kafka`` executor.

Nothing is imported here: a command imports the backend it opens (sqlite3 and
aiokafka are not needed to read a JSONL file).
"""
