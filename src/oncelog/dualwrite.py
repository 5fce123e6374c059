"""Atomic writes to a database and oncelog: the dual-write recipe of KIP-939 (its
"Motivation").

A database transaction and an oncelog transaction commit together, or neither does::

    from oncelog.dualwrite import DualWriter, SQLiteStore

    with DualWriter(SQLiteStore("orders.db"), bootstrap_servers="127.0.0.1:9092",
                    transactional_id="orders-writer-1") as writer:
        writer.recover()                                   # first: finish what a crash left
        with writer.transaction() as tx:
            future = tx.send("order-events", b'{"id": 7}', key=b"7")
            tx.prepare()                                   # optional here: see step 4
            tx.db.execute("INSERT INTO orders(id, event_offset) VALUES (?, ?)",
                          (7, future.result().offset))

The broker must allow two-phase commit (``transaction.two.phase.commit.enable=true``) and use
transaction version 2 (KIP-890, the default), so that every transaction has its own producer id
and epoch: that pair, as text (``PreparedTxnState``), is what the database records.

The normal processing recipe (``DualWriter.transaction``); ``on_step`` hears the name after
each step the writer performs:

    1. ``db_begin``      begin the database transaction (``store.begin()``)
    2. ``log_begin``     ``begin_transaction`` on the producer
    3.                   the caller sends (``tx.send``)
    4. ``prepared``      ``prepare_transaction``: every record is written (flushed) and the
                         transaction gets its identity, the PreparedTxnState; it takes no more
                         records and never times out. ``tx.prepare()`` inside the block does
                         this early, so that step 5 can use the records' offsets; otherwise
                         it happens when the block ends.
    5.                   the caller's own database writes (``tx.db``), in the transaction of 1
    6. ``state_saved``   ``store.save_state(transactional_id, str(state))``, same transaction
    7. ``db_committed``  commit the database transaction: THE decision
    8. ``log_committed`` ``commit_transaction`` on the producer

An exception before step 7 (in the block, in prepare, in save_state) rolls the database back
and aborts the oncelog transaction, then propagates. If step 7 fails, the writer rolls back
what is left of the database transaction, reads the stored state back and completes the
oncelog transaction by it (the recovery recipe below, in process): a commit that did happen is
finished, one that did not is aborted (and its error raised). If that cannot be decided (the
database is unreachable) or step 8 fails, ``RecoveryPendingError`` is raised and the oncelog
transaction stays prepared until ``recover()`` (or the next ``transaction()``, which calls it)
completes it.

The recovery recipe (``DualWriter.recover``, at start; ``on_step`` names in brackets):

    1. ``init_transactions(keep_prepared_txn=True)`` [``recovery_initialized``]: fences every
       earlier incarnation of this transactional id and keeps its open transaction, if any
    2. read the stored state [``recovery_state_loaded``]
    3. ``complete_transaction(stored)`` [``recovery_completed``]: commit the kept transaction
       if the database recorded it (its step 7 happened), abort it otherwise; nothing to do
       when none was open

Where a crash (the process killed) at each point leaves things, and why recovery fixes it:

- after 1 or 2: the database transaction dies with the connection (rolled back). No record
  reached the log, so the broker has no open transaction (transaction version 2 adds the
  partitions with the first record): recovery keeps nothing and completes nothing.
- after 3, 4, 5 or 6: the database rolled back; the oncelog transaction is open (two-phase
  transactions never time out), holding read_committed readers back. Recovery keeps it, finds
  the state of an earlier transaction (or none) in the database, which is not this one's, and
  aborts it.
- after 7, before 8 (the in-doubt window): the database committed, state included. Recovery
  keeps the transaction, finds its very state in the database and commits it.
- after 8: both committed; nothing is open, recovery does nothing.
- during recovery: the next recovery starts over; 1 fences the dead one and keeps the same
  transaction (its identity does not change), so 3 decides the same way.

The stored state names one transaction only: transaction version 2 bumps the epoch at every
commit and abort, and every restart bumps it, so an earlier transaction's state never equals a
later one's. (The broker refuses two-phase commit below transaction version 2.)

What this does not cover: effects outside the database and the log (an e-mail sent in the
block happens even if both roll back); a second writer with the same transactional id (the
newer one fences the older: ``ProducerFencedError``); and a writer that is never restarted:
its prepared transaction stays open for good, holding back read_committed readers, until an
operator terminates it (``oncelog transactions force-terminate``; an abort, so only when the
database does not hold that transaction's state). A writer is used from one thread at a time.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, Self

from .client.producer.producer import Producer
from .client.producer.transaction_manager import PreparedTxnState
from .client.types import RecordMetadata
from .errors import FatalError, TransactionalIdAuthorizationFailedError

log = logging.getLogger(__name__)

DEFAULT_TABLE = "kafka_transaction_state"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")

StepHook = Callable[[str], None]


class DualWriteError(Exception):
    """A dual write could not be carried out as asked."""


class RecoveryPendingError(DualWriteError):
    """The oncelog transaction is still prepared: the database transaction's commit failed in
    a way that could not be checked, or the oncelog commit after it failed. The database
    decides its fate; ``DualWriter.recover()`` (or the next ``transaction()``, or the next
    start) completes it. ``committed`` is True when the database commit is known to have
    happened (the transaction will commit), None when that is unknown."""

    def __init__(self, message: str, committed: bool | None) -> None:
        super().__init__(message)
        self.committed = committed


class Store(Protocol):
    """A database as a participant of the recipe. ``db`` is what the caller writes with (a
    DB-API connection); the state table maps transactional ids to PreparedTxnState text.

    ``begin``/``commit``/``rollback`` delimit one database transaction. ``save_state`` writes
    inside it and must fail if that transaction is no longer open (ended by an error or by the
    caller), since the state would then be written on its own. ``load_state`` reads the last
    committed state and is called with no transaction open. ``rollback`` must also leave the
    store usable after a failed commit (reconnecting if the connection broke)."""

    db: Any

    def begin(self) -> None: ...
    def load_state(self, transactional_id: str) -> str | None: ...
    def save_state(self, transactional_id: str, state: str) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


def _table_name(table: str) -> str:
    if not _IDENTIFIER.fullmatch(table):
        raise ValueError(f"not a plain SQL table name: {table!r}")
    return table


class SQLiteStore:
    """SQLite (the standard library's sqlite3): the state table is created if missing.

    ``db`` is a ``sqlite3.Connection`` in autocommit mode; the store issues ``BEGIN IMMEDIATE``
    (the write lock up front, so two writers never deadlock upgrading) and ``COMMIT`` itself.
    Placeholders are ``?``."""

    paramstyle = "qmark"

    def __init__(self, path: str | Path, *, table: str = DEFAULT_TABLE,
                 timeout: float = 30.0) -> None:
        self.path = str(path)
        self.table = _table_name(table)
        self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (transactional_id TEXT "
                        "PRIMARY KEY, prepared_transaction_state TEXT)")

    def begin(self) -> None:
        if self.db.in_transaction:
            raise DualWriteError("a database transaction is already open on this connection")
        self.db.execute("BEGIN IMMEDIATE")

    def load_state(self, transactional_id: str) -> str | None:
        row = self.db.execute(f"SELECT prepared_transaction_state FROM {self.table} "
                              "WHERE transactional_id = ?", (transactional_id,)).fetchone()
        return None if row is None else row[0]

    def save_state(self, transactional_id: str, state: str) -> None:
        # SQLite rolls a whole transaction back on some errors (SQLITE_FULL, SQLITE_IOERR,
        # ...): written now, the state would commit on its own.
        if not self.db.in_transaction:
            raise DualWriteError("the database transaction is no longer open (rolled back "
                                 "by an error, or ended by the caller)")
        self.db.execute(f"INSERT INTO {self.table} (transactional_id, "
                        "prepared_transaction_state) VALUES (?, ?) ON CONFLICT "
                        "(transactional_id) DO UPDATE SET prepared_transaction_state = "
                        "excluded.prepared_transaction_state", (transactional_id, state))

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def close(self) -> None:
        self.db.close()


class PostgresStore:
    """PostgreSQL through psycopg 3 (``pip install 'oncelog[postgres]'``); the state table is
    created if missing. ``db`` is a ``psycopg.Connection`` in autocommit mode; the store issues
    ``BEGIN`` and ``COMMIT`` itself (the server's default isolation level). Placeholders are
    ``%s``."""

    paramstyle = "format"

    def __init__(self, dsn: str, *, table: str = DEFAULT_TABLE, **connect_kwargs: Any) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ImportError("PostgresStore needs psycopg 3: pip install 'oncelog[postgres]'"
                              ) from exc
        self._psycopg = psycopg
        self.dsn = dsn
        self.table = _table_name(table)
        self._connect_kwargs = connect_kwargs
        self.db = self._connect()
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (transactional_id "
                        "VARCHAR(255) PRIMARY KEY, prepared_transaction_state TEXT)")

    def _connect(self) -> Any:
        return self._psycopg.connect(self.dsn, autocommit=True, **self._connect_kwargs)

    def _status(self) -> Any:
        return self.db.info.transaction_status

    def begin(self) -> None:
        if self._status() != self._psycopg.pq.TransactionStatus.IDLE:
            raise DualWriteError("a database transaction is already open on this connection")
        self.db.execute("BEGIN")

    def load_state(self, transactional_id: str) -> str | None:
        row = self.db.execute(f"SELECT prepared_transaction_state FROM {self.table} "
                              "WHERE transactional_id = %s", (transactional_id,)).fetchone()
        return None if row is None else row[0]

    def _require_open(self) -> None:
        status = self._status()
        if status == self._psycopg.pq.TransactionStatus.INERROR:
            raise DualWriteError("the database transaction failed (a statement raised); it "
                                 "can only roll back")
        if status != self._psycopg.pq.TransactionStatus.INTRANS:
            raise DualWriteError("the database transaction is no longer open (ended by the "
                                 "caller?)")

    def save_state(self, transactional_id: str, state: str) -> None:
        self._require_open()
        self.db.execute(f"INSERT INTO {self.table} (transactional_id, "
                        "prepared_transaction_state) VALUES (%s, %s) ON CONFLICT "
                        "(transactional_id) DO UPDATE SET prepared_transaction_state = "
                        "excluded.prepared_transaction_state", (transactional_id, state))

    def commit(self) -> None:
        # PostgreSQL answers COMMIT of a failed transaction with ROLLBACK, not an error.
        self._require_open()
        cursor = self.db.execute("COMMIT")
        if cursor.statusmessage != "COMMIT":
            raise DualWriteError(f"the database answered COMMIT with {cursor.statusmessage!r}")

    def rollback(self) -> None:
        if self.db.closed or self.db.broken:
            self._reconnect()
            return
        if self._status() == self._psycopg.pq.TransactionStatus.IDLE:
            return
        try:
            self.db.execute("ROLLBACK")
        except self._psycopg.OperationalError:
            self._reconnect()  # the connection died: its transaction with it

    def _reconnect(self) -> None:
        try:
            self.db.close()
        except Exception as exc:  # noqa: BLE001 - a broken connection may fail to close
            log.debug("closing a broken PostgreSQL connection: %s", exc)
        self.db = self._connect()

    def close(self) -> None:
        self.db.close()


class DualWriteTransaction:
    """One transaction of both stores, handed out by ``DualWriter.transaction()``."""

    def __init__(self, writer: DualWriter) -> None:
        self._writer = writer
        self.state: PreparedTxnState | None = None

    @property
    def db(self) -> Any:
        """The store's connection, inside the database transaction: write with it."""
        return self._writer.store.db

    @property
    def prepared(self) -> bool:
        return self.state is not None

    def send(self, topic: str, value: bytes | str | None = None, key: bytes | str | None = None,
             **kwargs: Any) -> Future[RecordMetadata]:
        """``Producer.send`` within the oncelog transaction (step 3); before ``prepare``."""
        if self.state is not None:
            raise DualWriteError("the transaction is prepared: it takes no more records")
        return self._writer.producer.send(topic, value, key=key, **kwargs)

    def prepare(self) -> PreparedTxnState:
        """Step 4: flush every record (their futures are then resolved, offsets included) and
        prepare the oncelog transaction. Done when the block ends unless called before."""
        if self.state is None:
            self.state = self._writer.producer.prepare_transaction(self._writer.timeout)
            self._writer._step("prepared")
        return self.state


class DualWriter:
    """The dual-write recipe over one transactional producer and one ``Store``.

    ``producer_config``/``producer_kwargs`` are the producer's (``transactional_id`` is
    required; two-phase commit is switched on here). The writer owns the store and the producer
    and closes both. ``timeout`` (seconds) bounds each broker call (init, prepare, commit,
    abort); ``on_step`` is called with each step's name after it (see the module's docstring).
    """

    def __init__(self, store: Store, producer_config: Mapping[str, Any] | None = None, *,
                 timeout: float = 30.0, on_step: StepHook | None = None,
                 **producer_kwargs: Any) -> None:
        from .client.config import producer_config as resolve_producer_config

        cfg = resolve_producer_config(producer_config, producer_kwargs)
        if cfg.transactional_id is None:
            raise ValueError("a DualWriter needs transactional_id (one per writer instance, "
                             "the same across its restarts)")
        if "transaction_two_phase_commit_enable" in cfg.given and \
                not cfg.transaction_two_phase_commit_enable:
            raise ValueError("the dual-write recipe needs transaction.two.phase.commit.enable")
        self.transactional_id: str = cfg.transactional_id
        self.store = store
        self.timeout = timeout
        self.on_step = on_step
        self._producer_config = producer_config
        self._producer_kwargs = {**producer_kwargs, "transaction_two_phase_commit_enable": True}
        self._producer: Producer | None = None
        self._pending_complete = False  # a prepared transaction awaits recovery
        self._pending_abort = False  # an abort timed out; retry it before the next begin
        self._fatal: BaseException | None = None
        self._in_transaction = False

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise DualWriteError("call recover() first (transaction() does)")
        return self._producer

    def _step(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise DualWriteError("this writer was fenced or failed for good; start a new one "
                                 "(it recovers the transaction)") from self._fatal
        if self._in_transaction:
            raise DualWriteError("a transaction of this writer is in progress")

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, FatalError):
            self._fatal = exc

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> None:
        """The recovery recipe: at the first call, start the producer keeping a transaction an
        earlier incarnation left open, then complete it by the state the database holds. Later
        calls complete a transaction this writer left prepared (``RecoveryPendingError``), and
        do nothing otherwise."""
        self._check_usable()
        if self._producer is None:
            producer = Producer(self._producer_config, **self._producer_kwargs)
            try:
                producer.init_transactions(self.timeout, keep_prepared_txn=True)
            except TransactionalIdAuthorizationFailedError as exc:
                producer.close()
                raise TransactionalIdAuthorizationFailedError(
                    f"{exc}; the broker refused two-phase commit for transactional id "
                    f"{self.transactional_id!r}: it must run with "
                    "transaction.two.phase.commit.enable=true (and allow this id)") from exc
            except BaseException:
                producer.close()
                raise
            self._producer = producer
            self._pending_complete = True
            self._step("recovery_initialized")
        if self._pending_abort:
            self._abort_log()
            if self._pending_abort:
                raise RecoveryPendingError("the abort of the last transaction did not complete",
                                           committed=False)
        if not self._pending_complete:
            return
        text = self.store.load_state(self.transactional_id)
        stored = PreparedTxnState(text or "")
        self._step("recovery_state_loaded")
        try:
            self.producer.complete_transaction(stored, self.timeout)
        except BaseException as exc:
            self._fail(exc)
            raise
        self._pending_complete = False
        log.info("dual writer %r: recovered (stored state %r)", self.transactional_id, str(stored))
        self._step("recovery_completed")

    # -- the normal recipe ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[DualWriteTransaction]:
        """One atomic write to both: see the module's docstring for the steps. The block sends
        with ``tx.send``, writes with ``tx.db``, and may call ``tx.prepare()`` first to see the
        records' offsets; an exception in it rolls both back."""
        self._check_usable()
        self.recover()
        store, producer = self.store, self.producer
        self._in_transaction = True
        try:
            store.begin()
            self._step("db_begin")
            tx = DualWriteTransaction(self)
            try:
                producer.begin_transaction()
                self._step("log_begin")
                yield tx
                state = tx.prepare()
                store.save_state(self.transactional_id, str(state))
                self._step("state_saved")
            except BaseException as exc:
                self._fail(exc)
                self._roll_back()
                raise
            self._commit(state)
        finally:
            self._in_transaction = False

    def _roll_back(self) -> None:
        try:
            self.store.rollback()
        except Exception:
            log.exception("dual writer %r: rolling the database back failed",
                          self.transactional_id)
        if self._fatal is None:
            self._abort_log()

    def _abort_log(self) -> None:
        try:
            self.producer.abort_transaction(self.timeout)
        except FatalError as exc:  # fenced: the new owner aborts it (its state is not ours)
            self._fatal = exc
            log.warning("dual writer %r: fenced while aborting: %s", self.transactional_id, exc)
        except Exception as exc:  # noqa: BLE001 - any other failure: retried later
            self._pending_abort = True
            log.warning("dual writer %r: abort failed (retried before the next transaction): "
                        "%s", self.transactional_id, exc)
        else:
            self._pending_abort = False

    def _commit(self, state: PreparedTxnState) -> None:
        try:
            self.store.commit()  # step 7: the decision
        except Exception as exc:  # noqa: BLE001 - any database's error: settled by reading back
            self._complete_after_failed_commit(state, exc)
            return
        self._step("db_committed")
        try:
            self.producer.commit_transaction(self.timeout)
        except BaseException as exc:
            self._fail(exc)
            if self._fatal is not None:
                raise  # fenced: the new owner commits it (the database holds its state)
            self._pending_complete = True
            raise RecoveryPendingError(
                f"the database committed but the oncelog commit failed ({exc}); recover() "
                "commits it", committed=True) from exc
        self._step("log_committed")

    def _complete_after_failed_commit(self, state: PreparedTxnState, error: Exception) -> None:
        """Step 7 failed: did the commit happen anyway? The recovery recipe, in process."""
        self._pending_complete = True
        try:
            self.store.rollback()  # what is left of the failed transaction; reconnects
            text = self.store.load_state(self.transactional_id)
        except Exception as exc:  # noqa: BLE001 - any database's error: recover() later
            raise RecoveryPendingError(
                f"the database commit failed ({error}) and its outcome cannot be read back "
                f"({exc}); recover() completes the oncelog transaction", committed=None
            ) from error
        stored = PreparedTxnState(text or "")
        try:
            self.producer.complete_transaction(stored, self.timeout)
        except BaseException as exc:
            self._fail(exc)
            if self._fatal is not None:
                raise
            raise RecoveryPendingError(
                f"completing the oncelog transaction failed ({exc}); recover() retries",
                committed=stored == state) from exc
        self._pending_complete = False
        if stored != state:
            raise error  # rolled back: both sides undone
        log.warning("dual writer %r: the database commit reported %s but happened; committed",
                    self.transactional_id, error)
        self._step("db_committed")
        self._step("log_committed")

    # -- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the producer and the store. A transaction left prepared stays open on the
        broker until the next recovery."""
        try:
            if self._producer is not None:
                self._producer.close()
        finally:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
