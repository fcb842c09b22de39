"""Shared fixtures: one tansu broker for the session's Kafka tests (started on first use)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Helper modules whose asserts are the tests' own: pytest's assertion
# introspection for them too (before their first import).
pytest.register_assert_rewrite("tests.import_support", "tests.ledger_contract")

from tests.tansu import Tansu  # noqa: E402

# How long an example takes is the machine's business (a loaded 2-core CI runner
# is many times slower than a workstation), never a test's outcome: no per-example
# deadline and no "too slow" health check for any property test. Tests that name
# their own settings inherit these.
settings.register_profile(
    "quotaledger", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("quotaledger")

_TOPICS = itertools.count()


@pytest.fixture(scope="session")
def tansu() -> Iterator[Tansu]:
    """A tansu broker on memory storage; killed (by pid) at the end of the session."""
    broker = Tansu().start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"t{next(_TOPICS)}-{name}"
