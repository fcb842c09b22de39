"""The stand-in for the Kubernetes API server used by the tests (DESIGN §12).

It lives in :mod:`quotaledger.adapters.bench.standin` so that ``quotaledger bench k8s``
can run against it too; it is not Kubernetes, only the part of its protocol the adapter uses.
"""

from quotaledger.adapters.bench.standin import ApiServer, EvictionAnswer
from quotaledger.adapters.bench.standin_requests import ApiCall

__all__ = ["ApiCall", "ApiServer", "EvictionAnswer"]
