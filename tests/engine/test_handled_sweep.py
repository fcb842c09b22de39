"""The bulk sweep of handled timers (engine/sweep.py) forgets exactly the keys
the one-by-one test (``core.armed_test``) says are not armed (DESIGN §6;
DECISIONS 63, 322), across successive sweeps of a changing state, as the
engine runs it: keys added and dropped between sweeps, clocks restarted,
pods held, moved to another quota or gone, the reclaim delay changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.engine.core import armed_test
from quotaledger.engine.sweep import HandledSweep, TimerKey
from quotaledger.projections.state import ProjectedState, Settings

UIDS = [f"p{i}" for i in range(12)]
QUEUES = ["a", "b", "c"]

keys = st.tuples(
    st.sampled_from(["reclaim", "reclaim", "overuse", "quota-decrease"]),
    st.sampled_from(QUEUES),
    st.sampled_from(UIDS),
    st.integers(0, 4).map(lambda k: 1000 + 100 * k),
).map(lambda t: (t[0], t[1], t[2] if t[0] == "reclaim" else "", t[3]))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_bulk_sweep_forgets_what_the_one_by_one_test_forgets(data: st.DataObject) -> None:
    state = ProjectedState()
    state.owing_since = {"a": 100}
    state.decrease_deadlines = {"b": 1100}
    sweep = HandledSweep()
    handled: set[TimerKey] = set()
    for _ in range(data.draw(st.integers(1, 8))):
        handled.update(data.draw(st.lists(keys, max_size=8)))  # type: ignore[arg-type]
        for key in sorted(handled)[: data.draw(st.integers(0, 3))]:
            handled.discard(key)
        after = data.draw(st.sampled_from([900, 900, 900, 800]))
        # most reclaim keys armed (their clock, quota and hold as the key
        # says), some not: another clock, another quota, held, pod gone
        starving: dict[str, int] = {}
        pod_quota: dict[str, str] = {}
        held: set[str] = set()
        for cause, queue, uid, deadline in sorted(handled):
            if cause != "reclaim":
                continue
            how = data.draw(st.sampled_from(["armed"] * 4 + ["since", "quota", "held", "gone"]))
            starving[uid] = deadline - after - (100 if how == "since" else 0)
            pod_quota[uid] = "c" if how == "quota" and queue != "c" else queue
            if how == "held":
                held.add(uid)
            if how == "gone":
                del starving[uid], pod_quota[uid]
        state.starving_since = starving
        state.starving_held = held
        state.pod_quota = pod_quota
        enabled = data.draw(st.sampled_from([True] * 5 + [False]))
        state.settings = Settings(reclaim_after_s=after / 1000, reclaim_enabled=enabled)
        armed = armed_test(state)
        expected = {key for key in handled if not armed(key)}
        gone = sweep.unarmed(state, handled, armed)
        assert sorted(gone) == sorted(expected)
        for key in gone:
            handled.discard(key)
