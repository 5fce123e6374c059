"""The broker's users file (``oncelog broker --users FILE``): one ``name:password`` per line;
blank lines and ``#`` comments are skipped. The password is everything after the first colon.
PLAIN logins check these passwords; the SCRAM users are seeded from them
(security/credential_store.py)."""

from __future__ import annotations

from pathlib import Path


class UsersFileError(ValueError):
    pass


def load_users(path: str | Path) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"cannot read the users file {path}: {exc}") from None
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, password = line.partition(":")
        name = name.strip()
        if not sep or not name or not password:
            raise UsersFileError(f"{path}:{number}: expected 'name:password', got {raw!r}")
        if name in users:
            raise UsersFileError(f"{path}:{number}: user {name!r} is defined twice")
        users[name] = password
    if not users:
        raise UsersFileError(f"the users file {path} defines no user")
    return users

