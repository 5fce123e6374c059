"""``oncelog users add | delete | list``: SCRAM users (KIP-554), a friendlier face over the same
Admin calls as ``oncelog configs --entity-type users`` (DescribeUserScramCredentials,
AlterUserScramCredentials)::

    oncelog users add alice --password alice-secret [--mechanism SCRAM-SHA-256] [--iterations N]
    oncelog users delete alice [--mechanism SCRAM-SHA-512]
    oncelog users list [--output json]

The new user's password: ``--password``, else $ONCELOG_NEW_USER_PASSWORD, else a prompt on a
terminal, else the first line of stdin. It is salted and hashed by the client, never sent. The
connection's own credentials are ``--user`` with ``--admin-password`` (or $ONCELOG_PASSWORD).
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable

from ..security.scram import MECHANISM_CODES
from .errors import describe as describe_error
from .table import print_json, print_table

NEW_PASSWORD_ENV = "ONCELOG_NEW_USER_PASSWORD"
MECHANISMS = list(MECHANISM_CODES)


def add_arguments(sub, add_bootstrap: Callable[..., None]) -> None:
    u = sub.add_parser("users", help="add, delete or list SCRAM users",
                       description="SCRAM users (KIP-554), as `configs --entity-type users` "
                       "manages them. The connection authenticates with --user and "
                       "--admin-password (or $ONCELOG_PASSWORD); --password is the new "
                       "user's.")
    usub = u.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    ua = usub.add_parser("add", help="add a user, or change its password")
    add_bootstrap(ua, password_flag="--admin-password")
    ua.add_argument("name", metavar="USER")
    ua.add_argument("--password", dest="new_password", default=None,
                    help=f"the user's password (default ${NEW_PASSWORD_ENV}, else a prompt, "
                    "else the first line of stdin)")
    ua.add_argument("--mechanism", action="append", choices=MECHANISMS, default=None,
                    help="repeatable (default: both)")
    ua.add_argument("--iterations", type=int, default=4096,
                    help="SCRAM iterations (default 4096, Kafka's; at least 4096)")
    ud = usub.add_parser("delete", help="delete a user's credentials")
    add_bootstrap(ud, password_flag="--admin-password")
    ud.add_argument("name", metavar="USER")
    ud.add_argument("--mechanism", action="append", choices=MECHANISMS, default=None,
                    help="only this mechanism's credential (repeatable; default: all)")
    ul = usub.add_parser("list", help="list users and their SCRAM mechanisms")
    add_bootstrap(ul, password_flag="--admin-password")
    ul.add_argument("--output", choices=["text", "json"], default="text")


def run(args, admin) -> int:
    if args.users_command == "list":
        return _list(admin, args.output)
    if args.users_command == "add":
        return _add(admin, args)
    return _delete(admin, args)


def _list(admin, output: str) -> int:
    users = admin.describe_user_scram_credentials()
    rows = [[user, ",".join(f"{i.mechanism}(iterations={i.iterations})"
                            for i in sorted(infos, key=lambda i: i.mechanism))]
            for user, infos in sorted(users.items())]
    if output == "json":
        print_json(["user", "mechanisms"], [
            [user, [{"mechanism": i.mechanism, "iterations": i.iterations}
                    for i in sorted(infos, key=lambda i: i.mechanism)]]
            for user, infos in sorted(users.items())])
    else:
        print_table(["User", "Mechanisms"], rows)
    return 0


def _new_password(args) -> str:
    if args.new_password is not None:
        return args.new_password
    if os.environ.get(NEW_PASSWORD_ENV):
        return os.environ[NEW_PASSWORD_ENV]
    if sys.stdin.isatty():
        first = getpass.getpass(f"Password for {args.name}: ")
        if getpass.getpass("Again: ") != first:
            raise ValueError("the passwords differ")
        return first
    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise ValueError(f"no password for {args.name}: give --password, "
                         f"${NEW_PASSWORD_ENV} or a line on stdin")
    return line


def _add(admin, args) -> int:
    from ..client.admin.scram_admin import UserScramCredentialUpsertion

    password = _new_password(args)
    mechanisms = args.mechanism or MECHANISMS
    return _alter(admin, args.name, [UserScramCredentialUpsertion(args.name, m, password,
                                                                  args.iterations)
                                     for m in mechanisms],
                  f"Added user {args.name} ({', '.join(mechanisms)}).")


def _delete(admin, args) -> int:
    from ..client.admin.scram_admin import UserScramCredentialDeletion

    # All of them by default: ask which it has (RESOURCE_NOT_FOUND for a user with none).
    mechanisms = args.mechanism or [
        i.mechanism for i in admin.describe_user_scram_credentials([args.name])[args.name]]
    return _alter(admin, args.name, [UserScramCredentialDeletion(args.name, m)
                                     for m in mechanisms],
                  f"Deleted user {args.name} ({', '.join(mechanisms)}).")


def _alter(admin, user: str, alterations: list, done: str) -> int:
    error = admin.alter_user_scram_credentials(alterations).get(user)
    if error is not None:
        print(f"oncelog users: {describe_error(error)}", file=sys.stderr)
        return 1
    print(done)
    return 0

