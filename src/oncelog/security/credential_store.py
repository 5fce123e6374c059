"""The broker's SCRAM users (KIP-554): where they are kept and what authentication reads.

``ScramCredentials`` holds, per mechanism, ``user -> ScramCredential`` (the dicts the SCRAM
server mechanism looks users up in at the first message of every exchange, so a user added is
able to log in at once and one deleted cannot; established connections are not cut, as in
Kafka). It is filled from a store and changed by AlterUserScramCredentials:

- ``LocalScramStore``, a single node's: ``scram-credentials.json`` in the data directory,
  rewritten atomically (temporary file, fsync, rename) on every change;
- ``ZkScramStore`` (cluster/zk_user_configs.py), a cluster's: ``/config/users/<user>`` in
  ZooKeeper with a change notification that every broker follows.

The users file (``sasl.users.file``) seeds both mechanisms (4096 iterations) of each user the
store has never held; once the store knows a user (added, altered or deleted through
AlterUserScramCredentials: a user whose last credential was deleted stays as an empty entry),
the file no longer touches it. PLAIN logins still check the users file's passwords (Kafka's
PLAIN reads its JAAS file, not the SCRAM credentials).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from .sasl import ScramCredential, scram_credential
from .scram import (
    MECHANISM_CODES,
    CredentialFormatError,
    Deletion,
    Upsertion,
    credential_from_string,
    credential_to_string,
    plan_alteration,
    scram_configs,
)

log = logging.getLogger("oncelog.security")

CREDENTIALS_FILE = "scram-credentials.json"
ALTER_ATTEMPTS = 10  # conditional writes lost to another broker's before giving up


class ScramStore(Protocol):
    def fetch(self, user: str) -> tuple[dict[str, str], int]: ...
    def load_all(self) -> dict[str, dict[str, str]]: ...
    def change(self, user: str, config: Mapping[str, str], version: int) -> bool: ...
    def seed(self, users: Mapping[str, Mapping[str, str]]) -> None: ...
    def watch(self, on_change: Callable[[str, dict[str, str]], Any]) -> None: ...
    def close(self) -> None: ...


class CredentialStoreError(ValueError):
    pass


class LocalScramStore:
    """A single node's users: one JSON file, ``{"version": 1, "users": {name: config}}``."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / CREDENTIALS_FILE
        self.users: dict[str, dict[str, str]] = {}
        if self.path.exists():
            try:
                d = json.loads(self.path.read_text())
                self.users = {str(u): {str(k): str(v) for k, v in c.items()}
                              for u, c in d["users"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CredentialStoreError(f"{self.path} is damaged: {exc}") from None

    def fetch(self, user: str) -> tuple[dict[str, str], int]:
        config = self.users.get(user)
        return (dict(config), 0) if config is not None else ({}, -1)

    def load_all(self) -> dict[str, dict[str, str]]:
        return {u: dict(c) for u, c in self.users.items()}

    def change(self, user: str, config: Mapping[str, str], version: int) -> bool:
        self.users[user] = dict(config)
        self._save()
        return True

    def seed(self, users: Mapping[str, Mapping[str, str]]) -> None:
        """The users file's users the store has never held (one rewrite for all)."""
        fresh = {u: dict(c) for u, c in users.items() if u not in self.users}
        if fresh:
            self.users.update(fresh)
            self._save()

    def watch(self, on_change: Callable[[str, dict[str, str]], Any]) -> None:
        pass  # nobody else writes a single node's file

    def close(self) -> None:
        pass

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"version": 1, "users": self.users}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class ScramCredentials:
    """What SCRAM authentication reads, and the two admin APIs on top of a store."""

    def __init__(self) -> None:
        # mechanism -> user -> credential: the dicts ScramServer looks users up in.
        self.by_mechanism: dict[str, dict[str, ScramCredential]] = {
            m: {} for m in MECHANISM_CODES}
        self.store: ScramStore | None = None
        self._lock = threading.Lock()  # one alteration at a time on this broker

    def open(self, store: ScramStore, seed: Mapping[str, str]) -> None:
        """Blocking: seed the users file's users the store has never held, load every user,
        follow the store's changes (a cluster's other brokers)."""
        self.store = store
        known = store.load_all()
        store.seed({user: {m: credential_to_string(scram_credential(m, password))
                           for m in MECHANISM_CODES}
                    for user, password in seed.items() if user not in known})
        store.watch(self.apply)
        for user, config in store.load_all().items():
            self.apply(user, config)

    def apply(self, user: str, config: Mapping[str, str]) -> None:
        """The user's credentials are now ``config`` (its SCRAM entries; none: deleted)."""
        for mechanism, users in self.by_mechanism.items():
            text = config.get(mechanism)
            if text is None:
                users.pop(user, None)
                continue
            try:
                users[user] = credential_from_string(text)
            except CredentialFormatError as exc:
                log.error("the %s credential of user %r is unreadable (%s): ignored",
                          mechanism, user, exc)
                users.pop(user, None)

    # -- DescribeUserScramCredentials / AlterUserScramCredentials (blocking) -------------------

    def describe(self, users: list[str] | None) -> dict[str, dict[str, int] | None]:
        """user -> {mechanism: iterations}, or None for a user named who has no credential;
        every user with one when ``users`` is None."""
        store = self._store()
        with self._lock:  # a single node's store is a dict an alteration may be changing
            if users is None:
                found = {u: scram_configs(c) for u, c in store.load_all().items()}
                return {u: _iterations(c) for u, c in sorted(found.items()) if c}
            out: dict[str, dict[str, int] | None] = {}
            for user in users:
                config = scram_configs(store.fetch(user)[0])
                out[user] = _iterations(config) if config else None
            return out

    def alter(self, upsertions: Iterable[Upsertion], deletions: Iterable[Deletion]
              ) -> dict[str, tuple[ErrorCode, str] | None]:
        """user -> None (done) or (error name, message), in the order Kafka answers: the
        refused users first, then the others."""
        store = self._store()
        ups, dels = list(upsertions), list(deletions)
        out: dict[str, tuple[ErrorCode, str] | None] = {}
        with self._lock:
            for _ in range(ALTER_ATTEMPTS):
                versions: dict[str, int] = {}
                plan = plan_alteration(ups, dels, _fetcher(store, versions))
                out.update(plan.errors)
                lost = set()
                for user, config in plan.changes.items():
                    if store.change(user, config, versions[user]):
                        self.apply(user, config)
                        out[user] = None
                    else:
                        lost.add(user)
                if not lost:
                    return out
                ups = [u for u in ups if u.user in lost]
                dels = [d for d in dels if d.user in lost]
            for user in lost:
                out[user] = (ErrorCode.unknown_server_error,
                             "the user's credentials kept changing under this request")
        return out

    def _store(self) -> ScramStore:
        if self.store is None:
            raise RuntimeError("the credential store is not open yet")
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _fetcher(store: ScramStore, versions: dict[str, int]) -> Callable[[str], dict[str, str]]:
    """The store's fetch for one plan, remembering each user's version for the write."""
    def fetch(user: str) -> dict[str, str]:
        config, versions[user] = store.fetch(user)
        return config
    return fetch


def _iterations(config: Mapping[str, str]) -> dict[str, int]:
    out = {}
    for mechanism, text in config.items():
        try:
            out[mechanism] = credential_from_string(text).iterations
        except CredentialFormatError:
            continue
    return out
