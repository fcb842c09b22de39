"""The full recompute of every derived number, on arrays (DESIGN §5; DECISIONS 122, 150).

:mod:`.arrays` recomputes every quota at once from the pod sums; :mod:`.totals`
holds the cluster-level sums that it and the incremental settle
(:mod:`quotaledger.projections.settle`) both compute. Nothing is imported here,
so importing one module of the package loads only what that module needs.
"""
