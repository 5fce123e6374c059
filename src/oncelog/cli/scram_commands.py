"""``oncelog configs --entity-type users``: SCRAM users, as Kafka's kafka-configs.sh manages them
(KIP-554)::

    oncelog configs --alter --entity-type users --entity-name alice \\
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]'
    oncelog configs --alter --entity-type users --entity-name alice --delete-config SCRAM-SHA-512
    oncelog configs --describe --entity-type users [--entity-name alice]

``oncelog configs`` hands ``--entity-type users`` to ``run_users`` (the other entity types are
its own business). The password is salted and hashed by the client, never sent.
"""

from __future__ import annotations

import re
import sys

from ..security.scram import MECHANISM_CODES
from .errors import describe as describe_error

_ENTRY = re.compile(r"\s*([A-Za-z0-9-]+)\s*=\s*\[([^\]]*)\]\s*")


def parse_add_config(text: str) -> list[tuple[str, int, str]]:
    """``SCRAM-SHA-256=[iterations=8192,password=pw],SCRAM-SHA-512=[password=pw]`` ->
    [(mechanism, iterations, password)]; iterations default to 4096, as Kafka's."""
    out: list[tuple[str, int, str]] = []
    pos = 0
    while pos < len(text):
        m = _ENTRY.match(text, pos)
        if m is None:
            raise ValueError(f"--add-config: expected MECHANISM=[iterations=N,password=PW], "
                             f"got {text[pos:]!r}")
        mechanism, body = m.group(1), m.group(2)
        if mechanism not in MECHANISM_CODES:
            raise ValueError(f"--add-config: {mechanism!r} is not a SCRAM mechanism; one of "
                             + ", ".join(MECHANISM_CODES))
        fields: dict[str, str] = {}
        for part in body.split(","):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("iterations", "password"):
                raise ValueError(f"--add-config: {part!r} in {mechanism}: expected "
                                 "iterations=N or password=PW")
            fields[key.strip()] = value
        if "password" not in fields:
            raise ValueError(f"--add-config: {mechanism} needs password=PW")
        try:
            iterations = int(fields.get("iterations", "4096"))
        except ValueError:
            raise ValueError(f"--add-config: iterations of {mechanism} must be a number") \
                from None
        out.append((mechanism, iterations, fields["password"]))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"--add-config: expected ',' at {text[pos:]!r}")
            pos += 1
    if not out:
        raise ValueError("--add-config: nothing to add")
    return out


def run_users(args, admin) -> int:
    """The users entity of ``oncelog configs`` (``admin``: an open Admin)."""
    from ..client.admin.scram_admin import (
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    if args.describe:
        users = [args.entity_name] if args.entity_name else None
        for user, infos in admin.describe_user_scram_credentials(users).items():
            described = ", ".join(f"{i.mechanism}=iterations={i.iterations}" for i in infos)
            print(f"SCRAM credential configs for user-principal '{user}' are {described}")
        return 0
    if not args.entity_name:
        raise ValueError("--alter --entity-type users needs --entity-name")
    alterations: list[UserScramCredentialUpsertion | UserScramCredentialDeletion] = []
    for text in args.add_config:
        alterations += [UserScramCredentialUpsertion(args.entity_name, m, pw, iterations)
                        for m, iterations, pw in parse_add_config(text)]
    for text in args.delete_config:
        for name in (n.strip() for n in text.split(",") if n.strip()):
            if name not in MECHANISM_CODES:
                raise ValueError(f"--delete-config: {name!r} is not a SCRAM mechanism")
            alterations.append(UserScramCredentialDeletion(args.entity_name, name))
    if not alterations:
        raise ValueError("--alter needs --add-config or --delete-config")
    failed = False
    for user, error in admin.alter_user_scram_credentials(alterations).items():
        if error is not None:
            print(f"oncelog configs: {describe_error(error)}", file=sys.stderr)
            failed = True
        else:
            print(f"Completed updating config for user {user}.")
    return 1 if failed else 0
