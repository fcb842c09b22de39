"""quotaledger.adapters."""
