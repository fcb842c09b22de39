"""quotaledger.projections."""
