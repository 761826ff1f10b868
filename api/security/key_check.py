"""Which key a connection presented: a key of the settings' list, a named key, or none.

The answer (``KeyIdentity``: the name usage is counted under, and its quota) is kept in the
connection's ASGI scope for the session to read (``identity_of``). A client must present a key
when ``OMNISERVE_API_KEYS`` lists any, any named key exists (``omniserve keys``) or
``OMNISERVE_REQUIRE_API_KEY`` is set; an unknown,
revoked or malformed key is refused (``unauthorized``) before anything is held for it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from pydantic import SecretStr
from starlette.requests import HTTPConnection

from streaming.keystore import ANONYMOUS, SETTINGS_KEY, KeyIdentity, KeyStore, well_formed

IDENTITY_SCOPE = "omniserve.key"


class KeyRefused(Exception):
    """The presented key is not let in; the message says why (for the ``error`` frame)."""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def listed(given: str, keys: Sequence[SecretStr]) -> bool:
    """Whether ``given`` is one of ``keys``, in constant time (every key is compared)."""
    probe = _digest(given)
    found = False
    for key in keys:
        found |= hmac.compare_digest(probe, _digest(key.get_secret_value()))
    return found


async def identify(
    given: str | None,
    flat_keys: Sequence[SecretStr],
    store: KeyStore | None,
    required: bool = False,
) -> KeyIdentity:
    """The identity of a connection that presented ``given``; KeyRefused when it may not in
    (``required``: a key is needed even when none is configured).

    Redis errors propagate (nothing can be served then).
    """
    if given is not None and not well_formed(given):
        raise KeyRefused("malformed API key")
    if given and listed(given, flat_keys):
        return KeyIdentity(SETTINGS_KEY)
    if given and store is not None:
        record = await store.lookup(given)
        if record is not None:
            if record.revoked:
                raise KeyRefused("API key revoked")
            return KeyIdentity(record.name, record.quota)
    if required or flat_keys or (store is not None and await store.any_keys()):
        raise KeyRefused("missing or invalid API key")
    return KeyIdentity(ANONYMOUS)


def identity_of(conn: HTTPConnection) -> KeyIdentity:
    """The identity ``let_in`` found for this connection (anonymous when none was looked up)."""
    found = conn.scope.get(IDENTITY_SCOPE)
    return found if isinstance(found, KeyIdentity) else KeyIdentity(ANONYMOUS)
