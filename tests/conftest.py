"""Shared fixtures: one tansu broker for the session's Kafka tests (started on first use)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.tansu import Tansu

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
