"""The dual-write recipe (KIP-939, oncelog.dualwrite): the example app
(oncelog.examples.dual_write) writes orders to a database and to a topic, is SIGKILLed right
after every step of the recipe (and of the recovery), restarted, and finishes; then the
database rows and the read_committed topic hold exactly the same orders (the rows even name
their events' offsets), and no transaction is left open. SQLite always; PostgreSQL against a
real server started here (skipped only when no PostgreSQL server binary is installed).
In-process tests cover a failed block, a failed or lying database commit, and a broker that
does not allow two-phase commit."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.raw_wire import RawConnection, list_offsets_request

from oncelog import Admin, Consumer, NewTopic, TopicPartition
from oncelog.dualwrite import DualWriter, RecoveryPendingError, SQLiteStore
from oncelog.errors import TransactionalIdAuthorizationFailedError
from oncelog.server.embedded import EmbeddedBroker

ENABLED = {"transaction.two.phase.commit.enable": "true",
           "transaction.state.log.num.partitions": "2"}
COUNT, BATCH, PARTITIONS = 7, 3, 2  # transactions [0 1 2] [3 4 5] [6]; the 2nd one crashes
STEPS = ["db_begin", "log_begin", "sent", "prepared", "db_written", "state_saved",
         "db_committed", "log_committed"]
# The crashed transaction's records stay in the log, aborted, once they were flushed (prepare).
ABORTED_AFTER = {"prepared", "db_written", "state_saved"}


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config=ENABLED) as b:
        yield b


# -- checking ------------------------------------------------------------------------------------

def log_end(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset)."""
    with RawConnection(bootstrap) as conn:
        hw = conn.request(list_offsets_request(topic, partition, -1)).topics[0]
        lso = conn.request(list_offsets_request(topic, partition, -1, isolation_level=1)).topics[0]
    return hw.partitions[0].offset, lso.partitions[0].offset


def read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[int, int, int]]:
    """(order id, partition, offset) of every data record up to the high watermark."""
    ends = {p: log_end(bootstrap, topic, p)[0] for p in range(PARTITIONS)}
    c = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                 auto_offset_reset="earliest", enable_auto_commit=False)
    out: list[tuple[int, int, int]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline = time.monotonic() + 15
        while any(c.position(tp) < ends[tp.partition] for tp in tps):
            assert time.monotonic() < deadline, "the consumer did not reach the end"
            out += [(json.loads(r.value)["id"], r.partition, r.offset) for r in c.poll(0.2)]
    finally:
        c.close()
    return out


def check_agreement(bootstrap: str, topic: str, txn_id: str, rows: list[tuple[int, int, int]],
                    aborted: int | None) -> None:
    """The database rows (id, event partition, event offset) and the topic agree exactly;
    ``aborted`` records of the crashed transaction are in the log, invisible (None: unknown)."""
    assert sorted(r[0] for r in rows) == list(range(COUNT)), "database: missing or extra orders"
    committed = read_all(bootstrap, topic, "read_committed")
    assert sorted(committed) == sorted(rows), "the topic and the database disagree"
    everything = read_all(bootstrap, topic, "read_uncommitted")
    if aborted is None:  # killed right after send(): some batches may have left, or none
        assert 0 <= len(everything) - COUNT <= BATCH
    else:
        assert len(everything) - COUNT == aborted
    for p in range(PARTITIONS):
        hw, lso = log_end(bootstrap, topic, p)
        assert lso == hw, f"partition {p}: a transaction is still open"
    with Admin(bootstrap_servers=bootstrap) as admin:
        state = admin.describe_transactions([txn_id])[txn_id]
    assert state.state in ("Empty", "CompleteCommit", "CompleteAbort"), state
    assert state.partitions == frozenset()


# -- running the example ---------------------------------------------------------------------------

def run_app(bootstrap: str, db_args: list[str], topic: str, txn_id: str,
            crash_at: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "oncelog.examples.dual_write", "--bootstrap-server", bootstrap,
           *db_args, "--topic", topic, "--transactional-id", txn_id, "--count", str(COUNT),
           "--batch", str(BATCH), "--partitions", str(PARTITIONS)]
    if crash_at:
        cmd += ["--crash-at", crash_at, "--crash-in", "2"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    if crash_at:
        assert out.returncode == -9, out.stderr  # SIGKILLed itself ...
        assert f"crash at {crash_at}" in out.stderr  # ... right there
    else:
        assert out.returncode == 0, out.stderr
    return out


def crash_then_finish(bootstrap: str, db_args: list[str], name: str,
                      crashes: list[str]) -> None:
    for step in crashes:
        run_app(bootstrap, db_args, name, name, crash_at=step)
    out = run_app(bootstrap, db_args, name, name)  # recovers first, then writes the rest
    # The crashed (2nd) transaction counts as written once its database commit happened.
    done = 2 * BATCH if crashes[0] in ("db_committed", "log_committed") else BATCH
    assert out.stdout.startswith(f"wrote {COUNT - done} orders"), out.stdout


def sqlite_rows(path: Path) -> list[tuple[int, int, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT id, event_partition, event_offset FROM orders").fetchall()


CASES = [[step] for step in STEPS] + [
    # Recovery itself killed, twice, before it completes an in-doubt (committed) transaction.
    ["db_committed", "recovery_initialized", "recovery_state_loaded"],
    # ... and a rolled-back one killed after completing it.
    ["state_saved", "recovery_completed"],
]


def expected_aborted(crashes: list[str]) -> int | None:
    if crashes[0] == "sent":
        return None  # some of the records may have left before the kill
    return BATCH if crashes[0] in ABORTED_AFTER else 0


@pytest.mark.slow
@pytest.mark.parametrize("crashes", CASES, ids="+".join)
def test_sqlite_crash_at_every_step(broker, tmp_path, crashes):
    name = "sqlite-" + "-".join(crashes).replace("_", "-")
    db = tmp_path / "orders.db"
    crash_then_finish(broker.bootstrap_servers, ["--db", str(db)], name, crashes)
    check_agreement(broker.bootstrap_servers, name, name, sqlite_rows(db),
                    expected_aborted(crashes))


# -- PostgreSQL ------------------------------------------------------------------------------------

def postgres_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    candidates = [found] if found else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    for pg_ctl in candidates:
        real = Path(pg_ctl).resolve()
        if (real.parent / "initdb").exists() and (real.parent / "postgres").exists():
            return real.parent
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server (as the postgres user when run as root); yields a
    function that creates a database and returns its DSN."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binary (pg_ctl/initdb) found: install Debian's "
                    "postgresql (scripts/bootstrap.sh --with-postgres)")
    import psycopg

    root = Path(tempfile.mkdtemp(prefix="oncelog-pg-"))
    as_user: list[str] = []
    if os.getuid() == 0:  # initdb refuses to run as root
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()

    def pg(*args: str) -> None:
        subprocess.run(as_user + [str(bindir / args[0]), *args[1:]], check=True,
                       capture_output=True, timeout=60)

    pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    try:
        pg("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "30", "-o",
           f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    except subprocess.CalledProcessError:
        print((root / "server.log").read_text())
        raise
    base = f"host=127.0.0.1 port={port} user=postgres"
    made = iter(range(1_000_000))

    def new_database() -> str:
        name = f"orders_{next(made)}"
        with psycopg.connect(f"{base} dbname=postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"{base} dbname={name}"

    try:
        yield new_database
    finally:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def postgres_rows(dsn: str) -> list[tuple[int, int, int]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT id, event_partition, event_offset FROM orders").fetchall()]


@pytest.mark.slow
@pytest.mark.parametrize("crashes", [[step] for step in STEPS], ids="+".join)
def test_postgres_crash_at_every_step(broker, postgres, crashes):
    name = "postgres-" + "-".join(crashes).replace("_", "-")
    dsn = postgres()
    crash_then_finish(broker.bootstrap_servers, ["--postgres", dsn], name, crashes)
    check_agreement(broker.bootstrap_servers, name, name, postgres_rows(dsn),
                    expected_aborted(crashes))


# -- in process: failures the library handles itself -----------------------------------------------

def make_topic(bootstrap: str, topic: str) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])


def writer_for(broker, db: Path, txn_id: str, store: SQLiteStore | None = None) -> DualWriter:
    store = store or SQLiteStore(db)
    store.db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    return DualWriter(store, bootstrap_servers=broker.bootstrap_servers,
                      transactional_id=txn_id, linger_ms=0, timeout=10)


def write(writer: DualWriter, topic: str, ids: range) -> None:
    with writer.transaction() as tx:
        for i in ids:
            tx.send(topic, json.dumps({"id": i}).encode(), key=str(i).encode())
            tx.db.execute("INSERT INTO orders (id) VALUES (?)", (i,))


def committed_ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(r[0] for r in read_all(bootstrap, topic, "read_committed"))


def db_ids(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute("SELECT id FROM orders"))


def test_an_exception_in_the_block_rolls_both_back(broker, tmp_path):
    make_topic(broker.bootstrap_servers, "in-block")
    with writer_for(broker, tmp_path / "o.db", "in-block") as w:
        write(w, "in-block", range(2))
        with pytest.raises(RuntimeError, match="the block failed"), w.transaction() as tx:
            tx.send("in-block", json.dumps({"id": 2}).encode())
            tx.db.execute("INSERT INTO orders (id) VALUES (2)")
            tx.prepare()
            raise RuntimeError("the block failed")
        write(w, "in-block", range(3, 4))  # the writer carries on
    assert db_ids(tmp_path / "o.db") == [0, 1, 3]
    assert committed_ids(broker.bootstrap_servers, "in-block") == [0, 1, 3]
    assert log_end(broker.bootstrap_servers, "in-block", 0)[1] == \
        log_end(broker.bootstrap_servers, "in-block", 0)[0]


class CommitFails(SQLiteStore):
    """A database whose COMMIT reports an error: before committing (``happened=False``: the
    transaction is still open, as after SQLITE_BUSY) or after (a lost answer)."""

    def __init__(self, path: Path, happened: bool) -> None:
        super().__init__(path)
        self.happened = happened
        self.fail_next = False
        self.fail_load = False

    def commit(self) -> None:
        if self.fail_next:
            self.fail_next = False
            if self.happened:
                super().commit()
            raise sqlite3.OperationalError("commit failed (test)")
        super().commit()

    def load_state(self, transactional_id: str) -> str | None:
        if self.fail_load:
            raise sqlite3.OperationalError("database unreachable (test)")
        return super().load_state(transactional_id)


@pytest.mark.parametrize("happened", [False, True], ids=["commit-lost", "commit-happened"])
def test_a_failed_database_commit_is_settled_by_reading_the_state_back(broker, tmp_path,
                                                                       happened):
    topic = f"failed-commit-{happened}"
    make_topic(broker.bootstrap_servers, topic)
    store = CommitFails(tmp_path / "o.db", happened)
    with writer_for(broker, tmp_path / "o.db", topic, store) as w:
        write(w, topic, range(2))
        store.fail_next = True
        if happened:
            write(w, topic, range(2, 4))  # the commit did happen: so does the log's
        else:
            with pytest.raises(sqlite3.OperationalError, match="commit failed"):
                write(w, topic, range(2, 4))
        write(w, topic, range(4, 5))
    expected = [0, 1, 2, 3, 4] if happened else [0, 1, 4]
    assert db_ids(tmp_path / "o.db") == expected
    assert committed_ids(broker.bootstrap_servers, topic) == expected


def test_an_unreadable_outcome_leaves_the_transaction_prepared_until_recover(broker, tmp_path):
    topic = "in-doubt"
    make_topic(broker.bootstrap_servers, topic)
    store = CommitFails(tmp_path / "o.db", happened=True)
    with writer_for(broker, tmp_path / "o.db", topic, store) as w:
        write(w, topic, range(1))
        store.fail_next = store.fail_load = True
        with pytest.raises(RecoveryPendingError) as info:
            write(w, topic, range(1, 3))
        assert info.value.committed is None
        assert log_end(broker.bootstrap_servers, topic, 1)[1] < \
            log_end(broker.bootstrap_servers, topic, 1)[0]  # still open: readers wait
        with pytest.raises(sqlite3.OperationalError):
            w.recover()  # still unreadable: still pending
        store.fail_load = False
        w.recover()  # the database has it: commit
        write(w, topic, range(3, 4))
    assert db_ids(tmp_path / "o.db") == [0, 1, 2, 3]
    assert committed_ids(broker.bootstrap_servers, topic) == [0, 1, 2, 3]


def test_a_broker_without_two_phase_commit_is_named_in_the_error(tmp_path):
    with EmbeddedBroker() as b:
        w = writer_for(b, tmp_path / "o.db", "no-2pc")
        try:
            with pytest.raises(TransactionalIdAuthorizationFailedError,
                               match="transaction.two.phase.commit.enable=true"):
                w.recover()
        finally:
            w.close()


def test_the_writer_needs_a_transactional_id(tmp_path):
    with pytest.raises(ValueError, match="transactional_id"):
        DualWriter(SQLiteStore(tmp_path / "o.db"), bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ValueError, match="two.phase"):
        DualWriter(SQLiteStore(tmp_path / "o.db"), bootstrap_servers="127.0.0.1:1",
                   transactional_id="x", transaction_two_phase_commit_enable=False)


def test_postgres_a_swallowed_statement_error_never_commits_the_log(broker, postgres):
    """PostgreSQL answers COMMIT of a failed transaction with ROLLBACK, silently: the store
    must notice, or the log would commit what the database dropped."""
    from oncelog.dualwrite import DualWriteError, PostgresStore

    topic = "pg-swallowed"
    make_topic(broker.bootstrap_servers, topic)
    store = PostgresStore(postgres())
    store.db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    with DualWriter(store, bootstrap_servers=broker.bootstrap_servers, transactional_id=topic,
                    linger_ms=0, timeout=10) as w:
        with w.transaction() as tx:
            tx.send(topic, json.dumps({"id": 0}).encode())
            tx.db.execute("INSERT INTO orders (id) VALUES (0)")
        with pytest.raises(DualWriteError, match="can only roll back"), w.transaction() as tx:
            tx.send(topic, json.dumps({"id": 1}).encode())
            tx.db.execute("INSERT INTO orders (id) VALUES (1)")
            try:
                tx.db.execute("INSERT INTO orders (id) VALUES (0)")  # duplicate key
            except Exception as exc:  # noqa: BLE001 - the careless caller under test
                print("ignored:", exc)
        rows = [r[0] for r in store.db.execute("SELECT id FROM orders ORDER BY id")]
    assert rows == [0]
    assert committed_ids(broker.bootstrap_servers, topic) == [0]
