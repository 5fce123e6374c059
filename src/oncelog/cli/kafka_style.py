"""Kafka's tools' command lines on ``oncelog``'s: an action flag (``kafka-topics.sh --create``,
``kafka-acls.sh --add``, ``kafka-consumer-groups.sh --describe``) is read as our action
(``topics create``, ``acls add``, ``groups describe``), and a usage error names the
(sub)command it is about, with that command's usage, as Kafka's tools print theirs.

``configs`` takes Kafka's ``--describe`` / ``--alter`` as they are (kafka-configs.sh has no
action words), and ``transactions`` its actions as words, as kafka-transactions.sh does.
"""

from __future__ import annotations

import argparse

# command -> {action flag: our action}; the first flag given wins, as the first of the
# tool's mutually exclusive actions would be refused anyway
ACTION_FLAGS: dict[str, dict[str, str]] = {
    "topics": {"--create": "create", "--list": "list", "--describe": "describe",
               "--alter": "alter", "--delete": "delete"},
    "acls": {"--add": "add", "--remove": "remove", "--list": "list"},
}
GROUP_ACTIONS = ("list", "describe", "reset-offsets", "delete-offsets", "delete")
for _command in ("groups", "consumer-groups"):
    ACTION_FLAGS[_command] = {f"--{a}": a for a in GROUP_ACTIONS}


def kafka_style(argv: list[str]) -> list[str]:
    """``topics --create --topic t`` as ``topics create --topic t``: the action flag moves to
    the action's place. A command line already naming an action is left as it is, so is one
    naming more than one action flag (the action parser then says what it takes)."""
    flags = ACTION_FLAGS.get(argv[0]) if argv else None
    if flags is None or (len(argv) > 1 and argv[1] in flags.values()):
        return argv
    given = [a for a in argv[1:] if a in flags]
    if len(set(given)) != 1:
        if len(set(given)) > 1:
            raise ActionFlagError(argv[0], "Command must include exactly one action: "
                             + ", ".join(flags))
        return argv
    flag = given[0]
    return [argv[0], flags[flag], *(a for a in argv[1:] if a != flag)]


class ActionFlagError(Exception):
    def __init__(self, command: str, message: str) -> None:
        super().__init__(message)
        self.command = command


def remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Every parser under ``parser`` leaves itself in the namespace (``_parser``): the deepest
    one parsed is the command a stray argument was given to."""
    parser.set_defaults(_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                remember_parsers(sub)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args`` whose "unrecognized arguments" error is the subcommand's (its
    usage line, exit 2) rather than the top-level one's. The namespace keeps that parser
    (``_parser``) for the checks that come later (cli/args.py's UsageError)."""
    remember_parsers(parser)
    try:
        argv = kafka_style(argv)
    except ActionFlagError as exc:
        target = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and exc.command in action.choices:
                target = action.choices[exc.command]
        target.error(str(exc))
    args, extras = parser.parse_known_args(argv)
    if extras:
        args._parser.error("unrecognized arguments: " + " ".join(extras))
    return args
