"""The Kafka ledger: one topic, one partition, read by Fetch requests (DESIGN §3, §10); see
:mod:`.ledger`."""
