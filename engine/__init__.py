"""quotaledger.engine."""
