"""Reading a Kafka ledger: Fetch responses walked into records (DESIGN §3, §10).

Rules every read keeps, whatever the broker:

* **the partition offset is the ledger offset.** A reader checks that every
  message follows the previous one. A skip is a hole only when proven
  (DECISIONS 200): a broker may make a later batch readable before an earlier
  one, so the reader fetches again from the first missing offset, never past
  it, until the records come, the broker proves them gone (the log start moved
  past them, transaction markers cover them) or ``gap_patience_s`` ends; then
  it stops with a ``LedgerGap`` naming the offsets, after handing out every
  record before them (DECISIONS 204), or with ``gaps=fill`` reads them as
  fillers (:class:`~.walk.GapJudge`). An offset going back (a broker that lost
  its log and started again) stops it with ``LedgerMismatch``. Record 0 must be
  ``LedgerOpened`` with this ledger's id, or the reader stops too (a reset topic
  re-initialised by someone else is another history);
* **ts** of a message is its value's ``at`` when present (and within the bounds
  of §9), else the Kafka record timestamp; then clamped up to the previous
  record's ts (:func:`.walk.sequence`). Every reader computes the same ts: it depends
  only on the values and timestamps of the records before it. A reader starting
  in the middle needs the ts of the record before its start: it knows it from
  records it read or from a loaded snapshot (whose ts is stored with it), and
  otherwise rescans the timestamps from the nearest point it knows (at worst
  offset 0);
* **reads are Fetch requests** sent through aiokafka's client, their record
  batches walked straight into records (:mod:`.fetch`, DECISIONS 140): a
  transaction marker (control batch) holds offsets but no record, so it is a
  gap, a proven one;
* **the tail is found by reading**: a read without ``follow`` ends at the first
  fetch that returns nothing, or once it has read up to the high watermark of
  its first answer (so it ends while others keep appending, DECISIONS 203).
  ``end_offsets`` and ``offsets_for_times`` are never used (tansu reports end
  offsets wrongly).

:class:`PartitionReads` holds what the reads of one ledger handle share (their
settings, the ts of records read, holes judged) and runs each read as steps of
a :class:`_Cursor`: take the next answer, wait at the tail, walk the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from quotaledger.events.ledger import LedgerError, LedgerGap, LedgerMismatch, Record

from .fetch import FETCH_BYTES, Fetched, PartitionFetcher
from .walk import GapJudge, first_message, opened_id, sequence

__all__ = ["GAP_PATIENCE_S", "HEAD_FETCH_BYTES", "TAIL_WAIT_MS", "PartitionReads"]

log = logging.getLogger("quotaledger.kafka")

#: How long the broker may wait for a first record on a read without follow (ms).
TAIL_WAIT_MS = 50
#: Fetch size of a look at record 0 (open, the idle follower's check every 2 s): a
#: broker returns a first batch whole even when it is bigger.
HEAD_FETCH_BYTES = 64 * 1024
_KNOWN_TS_LIMIT = 4096
#: How long offsets a fetch skipped may stay unreadable while later ones are
#: readable before a reader gives up on them (``gap_patience_s``, DECISIONS 200).
GAP_PATIENCE_S = 60.0
#: The first and the longest pause between fetches at a skip not yet proven (s).
HOLE_RETRY_S = 0.002
HOLE_RETRY_MAX_S = 0.2
#: A skip not seen for longer than this (no answer, a paused process) counts its patience
#: again from its next sighting: the patience is time the broker was seen serving reads.
HOLE_SEEN_GAP_S = 10.0


class PartitionReads:
    """The reads of one Kafka ledger handle (see the module docstring).

    The attributes below the ``where`` are the reads' settings; a test or a
    tool may change them on an open handle (``ledger.reads.fetch_bytes = 64``).
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        topic: str,
        client_options: dict[str, Any],
        *,
        poll_ms: int,
        fill_gaps: bool,
        gap_patience_s: float,
    ) -> None:
        self.bootstrap = list(bootstrap)
        self.topic = topic
        self.where = f"kafka://{','.join(self.bootstrap)}/{topic}"
        #: The TLS/SASL arguments of every client of the reads.
        self.client_options = client_options
        #: The id record 0 must carry ("" until the handle has read it).
        self.ledger_id = ""
        #: How long a follower's fetch waits at the tail (ms).
        self.poll_ms = poll_ms
        #: Read a skip inside the log as filler records instead of stopping (gaps=fill).
        self.fill_gaps = fill_gaps
        #: How long offsets a fetch skipped may stay unreadable, while later ones are
        #: readable, before the reader stops (gaps=stop) or fills them (gaps=fill).
        self.gap_patience_s = gap_patience_s
        #: How often an idle follower checks that record 0 is still there (seconds).
        self.reset_check_s = 2.0
        #: How long a read without follow waits for a first answer from the broker.
        self.read_timeout_s = 30.0
        #: How long a read without follow waits for records the high watermark promises.
        self.tail_patience_s = 30.0
        #: Bytes asked for per fetch.
        self.fetch_bytes = FETCH_BYTES
        #: Skips this handle waited at (a later batch readable before an earlier one).
        self.hole_waits = 0
        #: The highest offset this handle has seen (read, or assigned to its appends).
        self.max_offset = -1
        #: Holes this handle has judged gone after waiting (``first -> nxt``).
        self.judged: dict[int, int] = {}
        self.closed = False
        self._known_ts: dict[int, int] = {}
        self._fetchers: set[PartitionFetcher] = set()

    # ------------------------------------------------------------------ reads

    async def read(
        self,
        from_offset: int,
        *,
        follow: bool,
        check_opened: bool,
        head_only: bool = False,
        retry_connect: bool = True,
    ) -> AsyncGenerator[list[Record], None]:
        """Records from ``from_offset`` by Fetch requests (:mod:`.fetch`).

        While the records of one response are walked and handed out, the fetch
        of the next is already on its way (one prefetch, sent as soon as a
        response's end is known), so the broker works while the caller folds.
        ``head_only`` (a look at record 0: open, the idle follower's check) asks
        for :data:`HEAD_FETCH_BYTES` and walks only the first record fetched.
        ``retry_connect`` False (opening): a broker that cannot be reached is an error
        at once.
        """
        fetcher = await self._start_fetcher(
            HEAD_FETCH_BYTES if head_only else self.fetch_bytes,
            self.read_timeout_s if retry_connect else 0.0,
        )
        try:
            cursor = _Cursor(self, fetcher, from_offset, follow, check_opened, head_only)
            while not self.closed:
                fetched = await cursor.answer()
                if fetched is None:
                    if cursor.ended:
                        return
                    continue
                if not fetched.batches:
                    if await cursor.nothing_new(fetched):
                        return
                    continue
                records = cursor.walk(fetched)
                if cursor.pending is not None:
                    # one step of the loop sends the prefetch: without it the
                    # request would wait for the caller's fold of these records
                    await asyncio.sleep(0)
                if records:
                    yield records
                if cursor.judge.gap is not None:
                    # Every record before the gap has been handed out: stop at it
                    # with the error naming it (§10).
                    raise cursor.judge.gap
                if 0 <= cursor.until <= cursor.expected:
                    # every record that existed when the read began has been read:
                    # the tail, even if others keep appending (DECISIONS 203)
                    return
                await cursor.pause_at_hole()
        finally:
            self._fetchers.discard(fetcher)
            await fetcher.close()

    async def _start_fetcher(self, fetch_bytes: int, patience_s: float) -> PartitionFetcher:
        """A connected fetcher. The ledger is open, so a broker that cannot be reached
        now is one restarting or a link cut for a moment: connecting is tried again, as
        a failed fetch is, for up to ``patience_s`` (``read_timeout_s``), then the read
        fails with ``cannot connect`` (DECISIONS 227). Opening the ledger does not wait
        (``patience_s`` 0): a command whose broker is not there says so at once."""
        began = time.monotonic()
        while True:
            fetcher = PartitionFetcher(
                self.bootstrap, self.topic, self.where, self.client_options, fetch_bytes=fetch_bytes
            )
            self._fetchers.add(fetcher)
            try:
                await fetcher.start()
                return fetcher
            except LedgerError:
                self._fetchers.discard(fetcher)
                await fetcher.close()
                if self.closed or time.monotonic() - began >= patience_s:
                    raise
                log.warning("%s: cannot connect to read; trying again", self.where)
                await asyncio.sleep(0.5)
            except BaseException:
                self._fetchers.discard(fetcher)
                await fetcher.close()
                raise

    async def first_record(self, *, retry_connect: bool = True) -> Record | None:
        """Record 0, or None when the partition is empty. Only record 0 is looked at:
        whatever follows it in the first fetch (a hole, a marker, a bad record) is the
        business of the reads that hand it out, after the records before it (§10), so
        a ledger with a hole can still be opened to show the records before it."""
        reads = self.read(
            0, follow=False, check_opened=False, head_only=True, retry_connect=retry_connect
        )
        async with contextlib.aclosing(reads) as batches:
            async for batch in batches:
                return batch[0]
        return None

    async def last_offset(self) -> int:
        """Offset of the newest record (-1 for none), found by reading to the tail."""
        last = max(self.max_offset, -1)
        async for batch in self.read(max(0, last), follow=False, check_opened=True):
            last = batch[-1].offset
        return last

    async def ts_at(self, offset: int) -> int:
        """The ledger ts of the record at ``offset``."""
        if offset in self._known_ts:
            return self._known_ts[offset]
        async for batch in self.read(offset, follow=False, check_opened=True):
            return batch[0].ts
        raise LedgerError(f"{self.where}: there is no record at offset {offset}")

    async def close(self) -> None:
        """End every read (their fetches are cut)."""
        self.closed = True
        for fetcher in list(self._fetchers):
            await fetcher.close()

    # ----------------------------------------------------- what reads know

    def resume_point(self, from_offset: int) -> tuple[int, int]:
        """Where to start reading to know the ts before ``from_offset``: the
        offset to fetch from and the ts of the record before it."""
        if from_offset == 0:
            return 0, 0
        if from_offset - 1 in self._known_ts:
            return from_offset, self._known_ts[from_offset - 1]
        below = [offset for offset in self._known_ts if offset < from_offset]
        if not below:
            return 0, 0
        best = max(below)
        return best + 1, self._known_ts[best]

    def remember(self, offset: int, ts: int) -> None:
        """The ts of the record at ``offset`` (the last few thousand are kept)."""
        known = self._known_ts
        known[offset] = ts
        if len(known) > _KNOWN_TS_LIMIT:
            for old in list(known)[: _KNOWN_TS_LIMIT // 4]:
                del known[old]

    # ----------------------------------------------------------- verdicts

    async def verify_head(self) -> None:
        """A follower idle at the tail checks record 0 is still this ledger's:
        a broker that lost its log (memory storage restarted) is detected even
        when nobody appends. Record 0 deleted (the log now starts later:
        retention, ``DeleteRecords``) stops the follower too, with
        :class:`LedgerGap`: the ledger is no longer whole (§3), and no later
        check could find it whole again. An unreachable broker is not a verdict."""
        try:
            first = await self.first_record()
        except LedgerMismatch:
            raise
        except LedgerGap as exc:
            raise LedgerGap(
                f"{self.where}: record 0 (LedgerOpened {self.ledger_id}) can no longer be"
                f" read; refusing to follow a ledger that is not whole: {exc}",
                missing=exc.missing,
                found=exc.found,
            ) from None
        except (LedgerError, KafkaError) as exc:
            log.warning("%s: cannot check record 0 (%s)", self.where, exc)
            return
        if first is None:
            raise LedgerMismatch(
                f"{self.where}: record 0 (LedgerOpened {self.ledger_id}) is gone: the"
                " broker lost its log; refusing to follow another history"
            )
        self.check_opened(first.payload)

    def check_opened(self, value: bytes) -> None:
        """Record 0's value must be this ledger's ``LedgerOpened``."""
        found = opened_id(Record(0, 0, value), self.where)
        if found != self.ledger_id:
            raise LedgerMismatch(
                f"{self.where}: offset 0 holds ledger_id {found!r}, not {self.ledger_id!r}:"
                " the topic was reset and re-initialised; refusing to mix two histories"
            )

    def out_of_range(self, fetched: Fetched, position: int) -> Fetched:
        """Judge the broker's OFFSET_OUT_OF_RANGE at ``position`` (tansu never
        answers it; Apache Kafka does): before the log's start, records were
        deleted; beyond its end after this handle saw a record there, the log
        was reset; beyond its end otherwise, the tail (nothing is there yet)."""
        if 0 <= position < fetched.log_start or (position == 0 and fetched.log_start < 0):
            raise LedgerGap(
                f"{self.where}: offset {position} is no longer in the partition (its log"
                f" starts at offset {fetched.log_start}): records were deleted by retention"
                " or compaction; a ledger must be gap-free",
                missing=position,
                found=fetched.log_start if fetched.log_start > position else None,
            )
        if position <= self.max_offset + 1 and position > 0 and self.max_offset >= 0:
            raise LedgerMismatch(
                f"{self.where}: offset {position - 1} was read before, but the broker now"
                f" says offset {position} is out of range: the log was reset (a broker that"
                " lost its data?); refusing to mix two histories"
            )
        return Fetched([], position, position, fetched.log_start)

    def give_up(self, first: int, nxt: int, waited: float) -> LedgerGap | None:
        """The bounded wait at offsets ``first..nxt-1`` has ended (DECISIONS 200):
        the :class:`LedgerGap` naming them, for the reader to raise once it has
        handed out the records before them; with ``gaps=fill`` (never at offset 0)
        None: they are judged gone, with a warning, and filled by the next walk."""
        if not self.fill_gaps or first == 0:
            return LedgerGap(
                f"{self.where}: offset {first} is missing: offsets {first}..{nxt - 1} held no"
                f" record for {waited:.1f} s while offset {nxt} was readable (a write the"
                " broker lost, or records deleted by retention or compaction); a ledger"
                " must be gap-free",
                missing=first,
                found=nxt,
            )
        log.warning(
            "%s: offsets %d..%d held no record for %.1f s while offset %d was readable:"
            " a write the broker lost before acknowledging it; filling them (gaps=fill)",
            self.where,
            first,
            nxt - 1,
            waited,
            nxt,
        )
        self.judged[first] = nxt
        return None


class _Cursor:
    """One read's place in the partition, and its steps (:meth:`PartitionReads.read`).

    ``position`` is where the next fetch starts, ``expected`` the next ledger
    offset: they differ after a control batch (a gap, §10).
    """

    def __init__(
        self,
        reads: PartitionReads,
        fetcher: PartitionFetcher,
        from_offset: int,
        follow: bool,
        check_opened: bool,
        head_only: bool,
    ) -> None:
        self.reads = reads
        self.fetcher = fetcher
        self.from_offset = from_offset
        self.follow = follow
        self.check_opened = check_opened
        self.head_only = head_only
        start, self.prev_ts = reads.resume_point(from_offset)
        self.position = self.expected = start
        self.fetch_wait = reads.poll_ms if follow else TAIL_WAIT_MS
        self.now = self.checked = self.silent_since = self.answered = time.monotonic()
        self.asked = self.now  # when the fetch now awaited was sent
        self.failing = False
        self.pending: asyncio.Future[Fetched] | None = None
        self.judge = GapJudge(reads.where, reads.fill_gaps, reads.judged)
        #: Without follow: the high watermark of the first answer, where the read ends.
        self.until = -1
        #: Where the last walk stopped at a skip (-1: it did not).
        self.nxt = -1
        #: The read ends (set by :meth:`answer`).
        self.ended = False
        # a skip being waited on: its first offset, since when, when last seen, and
        # the next retry's pause
        self.hole_at, self.hole_seen, self.hole_last = -1, 0.0, 0.0
        self.hole_delay = HOLE_RETRY_S

    async def answer(self) -> Fetched | None:
        """The next fetch's answer, taken in; None when there is none to walk:
        the broker failed (it is asked again after a pause) or the read ends
        (:attr:`ended`: the ledger is closing)."""
        reads = self.reads
        try:
            if self.pending is None:
                self.asked = time.monotonic()
                fetched = await self.fetcher.fetch(self.position, self.fetch_wait)
            else:
                try:
                    fetched = await self.pending
                except asyncio.CancelledError:
                    # close() cancels the fetch sent ahead: the read ends,
                    # as it does when close() cuts a fetch awaited directly
                    task = asyncio.current_task()
                    if reads.closed and (task is None or not task.cancelling()):
                        self.ended = True
                        return None
                    raise
                self.pending = None
        except KafkaError as exc:
            # connection lost, leader moved, topic unknown for now: wait, ask again
            self.pending = None
            if reads.closed:
                self.ended = True
                return None
            if not self.follow and time.monotonic() - self.answered > reads.read_timeout_s:
                raise LedgerError(
                    f"{reads.where}: no answer from the broker for"
                    f" {reads.read_timeout_s:.0f} s ({exc})"
                ) from None
            if not self.failing:
                log.warning("%s: read failed (%s); retrying", reads.where, exc)
                self.failing = True
            await asyncio.sleep(0.2)
            return None
        self.now = self.answered = time.monotonic()
        if self.failing:
            log.info("%s: reading again", reads.where)
            self.failing = False
        if fetched.out_of_range:
            fetched = reads.out_of_range(fetched, self.position)
        if self.until < 0 and not self.follow and fetched.highwater is not None:
            self.until = fetched.highwater
        if self.head_only:
            head = first_message(fetched.batches)
            fetched.batches = [] if head is None else [[head]]
        return fetched

    async def nothing_new(self, fetched: Fetched) -> bool:
        """An answer without records: wait at the tail (follow), or decide whether
        this is the tail (True: the read ends)."""
        reads = self.reads
        self.position = fetched.position  # past control batches, if any
        # A broker that answers at once with nothing must not make this a busy
        # loop: at least the fetch wait between asks.
        idle = self.fetch_wait / 1000 - (self.now - self.asked)
        if idle > 0:
            await asyncio.sleep(idle)
            self.now = time.monotonic()
        now = self.now
        if self.follow:
            if now - self.checked >= reads.reset_check_s:
                self.checked = now
                await reads.verify_head()
            return False
        high = fetched.highwater
        if high is None:
            # The answer did not cover the partition: not the tail.
            if now - self.silent_since > reads.read_timeout_s:
                raise LedgerError(
                    f"{reads.where}: no answer from the broker for {reads.read_timeout_s:.0f} s"
                )
            return False
        if high > self.position and self.fetch_wait < 2000:
            # Records are promised but the fetch came back empty: a broker reading
            # slow storage (tansu on s3) answers at the fetch wait. Ask again with a
            # longer one (DECISIONS 79).
            self.fetch_wait = min(self.fetch_wait * 4, 2000)
            return False
        if high > self.position and now - self.silent_since <= reads.tail_patience_s:
            return False  # the broker says more is there: fetch again
        if high > self.position:
            # tansu after a crash may report a high watermark past the records it
            # kept: what exists has been read.
            log.warning(
                "%s: high watermark %d but no record after offset %d for %.0f s;"
                " reading ends there",
                reads.where,
                high,
                self.expected - 1,
                reads.tail_patience_s,
            )
        return True

    def walk(self, fetched: Fetched) -> list[Record]:
        """The records of an answer (the next fetch sent ahead first); at a skip,
        what the wait there has come to."""
        reads = self.reads
        self.silent_since = self.now
        if fetched.position > self.position and not self.head_only:
            self.asked = time.monotonic()
            self.pending = self.fetcher.prefetch(fetched.position, self.fetch_wait)
        if self.expected == 0 and self.check_opened:
            head = first_message(fetched.batches)
            if head is not None and head.offset == 0:
                reads.check_opened(head.value or b"")
        self.judge.saw(fetched, self.expected)
        walked_from = self.expected
        records, self.expected, self.prev_ts, self.nxt = sequence(
            reads.where, fetched.batches, self.expected, self.prev_ts, self.from_offset, self.judge
        )
        if self.expected > walked_from:
            reads.remember(self.expected - 1, self.prev_ts)
            if self.expected - 1 > reads.max_offset:
                reads.max_offset = self.expected - 1
        if self.nxt < 0:
            self.position = fetched.position
            if self.hole_at >= 0:
                _hole_closed(reads.where, self.hole_at, self.expected, self.now - self.hole_seen)
                self.hole_at = -1
        elif self.judge.gap is not None:
            # A proven gap: the reader stops at it, after the records before it (§10).
            self._drop_prefetch()
        else:
            self._wait_at_hole()
        return records

    def _wait_at_hole(self) -> None:
        """A skip not proven permanent: fetch again from its first offset, never
        past it, until it is readable or judged (DECISIONS 200)."""
        reads, now, expected = self.reads, self.now, self.expected
        self._drop_prefetch()
        self.position = expected
        if self.hole_at != expected:
            self.hole_at, self.hole_seen, self.hole_delay = expected, now, HOLE_RETRY_S
            reads.hole_waits += 1
            log.debug(
                "%s: offsets %d..%d not readable yet; waiting", reads.where, expected, self.nxt - 1
            )
        elif now - self.hole_last > HOLE_SEEN_GAP_S:
            # not seen for a while (the broker, or this reader, stopped or
            # restarted): the patience counts again from now
            self.hole_seen = now
        elif now - self.hole_seen >= reads.gap_patience_s:
            self.judge.gap = reads.give_up(expected, self.nxt, now - self.hole_seen)
            self.hole_at, self.hole_delay = -1, 0.0  # judged: the next walk fills
        self.hole_last = now

    def _drop_prefetch(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    async def pause_at_hole(self) -> None:
        """After a walk that stopped at a skip: a growing pause before fetching again."""
        if self.nxt >= 0 and self.hole_delay > 0:
            await asyncio.sleep(self.hole_delay)
            self.hole_delay = min(self.hole_delay * 2, HOLE_RETRY_MAX_S)


def _hole_closed(where: str, first: int, expected: int, waited: float) -> None:
    """Offsets a skip had left out were read after all: the wait was right."""
    level = logging.INFO if waited >= 1.0 else logging.DEBUG
    log.log(
        level,
        "%s: offset %d became readable after %.3f s (read through offset %d)",
        where,
        first,
        waited,
        expected - 1,
    )
