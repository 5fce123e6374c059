"""SASL mechanisms, both halves, sans IO: PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512
(RFC 5802, RFC 7677), as Kafka offers them (KIP-43, KIP-84).

A server mechanism takes the client's token and returns the next challenge (or the final
server message); ``done`` says when the exchange is over, ``username`` who authenticated.
Failures raise ``AuthenticationFailed`` with a message fit for the client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 4096
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
BAD_CREDENTIALS = "Authentication failed: Invalid username or password"
_JAAS_OPTION = re.compile(r'\b(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
# The login module Kafka's JAAS configuration names for each mechanism.
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def jaas_login_module(text: str) -> str:
    """The login module a ``sasl.jaas.config`` value names (its first word): Kafka's
    ``org.apache.kafka.common.security.scram.ScramLoginModule required username="alice"
    password="secret";``."""
    words = text.split()
    return words[0] if words else ""


def jaas_options(text: str) -> dict[str, str]:
    """The quoted options of a ``sasl.jaas.config`` value (``username``, ``password`` ...)."""
    return dict(_JAAS_OPTION.findall(text))


class AuthenticationFailed(Exception):
    pass


@dataclass(frozen=True)
class ScramCredential:
    """What a server keeps of a password (never the password itself)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(mechanism: str, password: str, salt: bytes | None = None,
                     iterations: int = SCRAM_ITERATIONS) -> ScramCredential:
    h = _HASHES[mechanism]
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac(h, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    return ScramCredential(salt, iterations, hashlib.new(h, client_key).digest(),
                           hmac.new(salted, b"Server Key", h).digest())


def _parse_attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthenticationFailed(f"malformed SCRAM message: {message!r}")
        out[part[0]] = part[2:]
    return out


def _unescape(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("malformed SCRAM username")
    return name.replace("=2C", ",").replace("=3D", "=")


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class PlainServer:
    mechanism = "PLAIN"

    def __init__(self, passwords: dict[str, str]) -> None:
        self.passwords = passwords
        self.done = False
        self.username: str | None = None
        self.attempted: str | None = None  # who tried, for the log of a failed attempt

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Authentication failed: malformed PLAIN token")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Authentication failed: PLAIN token is not UTF-8") \
                from None
        if not user:
            raise AuthenticationFailed("Authentication failed: no username")
        self.attempted = user
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: the authorization id must be "
                                       "the username")
        expected = self.passwords.get(user)
        # compare_digest on equal-length digests: no timing hint about the password
        if expected is None or not hmac.compare_digest(
                hashlib.sha256(password.encode()).digest(),
                hashlib.sha256(expected.encode()).digest()):
            raise AuthenticationFailed(BAD_CREDENTIALS)
        self.username = user
        self.done = True
        return b""


class ScramServer:
    def __init__(self, mechanism: str, credentials: dict[str, ScramCredential]) -> None:
        self.mechanism = mechanism
        self.hash = _HASHES[mechanism]
        self.credentials = credentials
        self.done = False
        self.username: str | None = None
        self._state = "first"
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._cred: ScramCredential | None = None
        self._user = ""
        self.attempted: str | None = None  # who tried, for the log of a failed attempt

    def step(self, token: bytes) -> bytes:
        try:
            message = token.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("malformed SCRAM message (not UTF-8)") from None
        if self._state == "first":
            return self._first(message)
        if self._state == "final":
            return self._final(message)
        raise AuthenticationFailed("SCRAM exchange already finished")

    def _first(self, message: str) -> bytes:
        # gs2-header: "n,," or "n,a=authzid,"; channel binding is not supported ("y"/"p").
        if not message.startswith(("n,", "y,")):
            raise AuthenticationFailed("SCRAM: channel binding is not supported")
        gs2_end = message.find(",", 2)
        if gs2_end < 0:
            raise AuthenticationFailed("malformed SCRAM client-first message")
        self._gs2 = message[:gs2_end + 1]
        bare = message[gs2_end + 1:]
        attrs = _parse_attributes(bare)
        if "m" in attrs or "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise AuthenticationFailed("malformed SCRAM client-first message")
        authzid = self._gs2[2:-1]
        self._user = _unescape(attrs["n"])
        self.attempted = self._user
        if authzid and _unescape(authzid.removeprefix("a=")) != self._user:
            raise AuthenticationFailed("SCRAM: the authorization id must be the username")
        self._cred = self.credentials.get(self._user)
        salt = self._cred.salt if self._cred else hashlib.sha256(
            b"oncelog-unknown-user:" + self._user.encode()).digest()[:16]
        iterations = self._cred.iterations if self._cred else SCRAM_ITERATIONS
        self._nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        self._client_first_bare = bare
        self._server_first = (f"r={self._nonce},s={base64.b64encode(salt).decode()},"
                              f"i={iterations}")
        self._state = "final"
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        self._state = "done"
        proof_at = message.rfind(",p=")
        if proof_at < 0:
            raise AuthenticationFailed("malformed SCRAM client-final message")
        without_proof = message[:proof_at]
        attrs = _parse_attributes(message)
        try:
            channel = base64.b64decode(attrs.get("c", ""), validate=True).decode()
            proof = base64.b64decode(attrs["p"], validate=True)
        except (ValueError, KeyError):
            raise AuthenticationFailed("malformed SCRAM client-final message") from None
        if channel != self._gs2 or attrs.get("r") != self._nonce:
            raise AuthenticationFailed("SCRAM: channel binding or nonce mismatch")
        if self._cred is None:
            raise AuthenticationFailed(BAD_CREDENTIALS)
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}"
        signature = hmac.new(self._cred.stored_key, auth_message.encode(), self.hash).digest()
        if len(proof) != len(signature):
            raise AuthenticationFailed(BAD_CREDENTIALS)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(),
                                   self._cred.stored_key):
            raise AuthenticationFailed(BAD_CREDENTIALS)
        server_signature = hmac.new(self._cred.server_key, auth_message.encode(),
                                    self.hash).digest()
        self.username = self._user
        self.done = True
        return f"v={base64.b64encode(server_signature).decode()}".encode()


def server_for(mechanism: str, passwords: dict[str, str],
               scram: dict[str, dict[str, ScramCredential]]):
    if mechanism == "PLAIN":
        return PlainServer(passwords)
    return ScramServer(mechanism, scram[mechanism])


# -- the client side ---------------------------------------------------------------------------


class PlainClient:
    def __init__(self, username: str, password: str) -> None:
        self.username, self.password = username, password
        self.done = False

    def first(self) -> bytes:
        return b"\0" + self.username.encode() + b"\0" + self.password.encode()

    def step(self, challenge: bytes) -> bytes | None:
        self.done = True
        return None


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str,
                 nonce: str | None = None) -> None:
        self.hash = _HASHES[mechanism]
        self.username, self.password = username, password
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()
        self.done = False
        self._bare = f"n={_escape(username)},r={self.nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def step(self, challenge: bytes) -> bytes | None:
        """The answer to the server's message; None once the exchange is over."""
        message = challenge.decode()
        attrs = _parse_attributes(message)
        if not self._server_signature:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
            if not nonce.startswith(self.nonce):
                raise AuthenticationFailed("SCRAM: the server's nonce does not extend ours")
            salted = hashlib.pbkdf2_hmac(self.hash, self.password.encode(), salt, iterations)
            client_key = hmac.new(salted, b"Client Key", self.hash).digest()
            stored_key = hashlib.new(self.hash, client_key).digest()
            without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
            auth_message = f"{self._bare},{message},{without_proof}"
            signature = hmac.new(stored_key, auth_message.encode(), self.hash).digest()
            proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
            server_key = hmac.new(salted, b"Server Key", self.hash).digest()
            self._server_signature = hmac.new(server_key, auth_message.encode(),
                                              self.hash).digest()
            return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
        if "e" in attrs:
            raise AuthenticationFailed(f"SCRAM: the server refused: {attrs['e']}")
        if base64.b64decode(attrs.get("v", "")) != self._server_signature:
            raise AuthenticationFailed("SCRAM: the server's signature is wrong")
        self.done = True
        return None


def client_for(mechanism: str, username: str, password: str):
    if mechanism == "PLAIN":
        return PlainClient(username, password)
    if mechanism in _HASHES:
        return ScramClient(mechanism, username, password)
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}; one of {', '.join(MECHANISMS)}")
