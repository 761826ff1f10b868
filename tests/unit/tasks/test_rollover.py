"""When a session rolls over (``RolloverPolicy``)."""

from __future__ import annotations

from omnicore.settings import Settings
from tasks.rollover import RolloverPolicy


def test_defaults_are_shares_of_the_backends_context() -> None:
    p = RolloverPolicy.of(Settings(), 8192)
    assert (p.enabled, p.budget, p.prime, p.limit) == (True, 6144, 1536, 8192)
    p = RolloverPolicy.of(Settings(rollover_kv_tokens=300, rollover_prime_tokens=50), 8192)
    assert (p.budget, p.prime) == (300, 50)
    assert RolloverPolicy.of(Settings(rollover_kv_tokens=99999), 8192).budget == 8192


def test_due_at_the_budget_and_while_speaking_only_halfway_to_the_limit() -> None:
    p = RolloverPolicy(enabled=True, budget=6000, prime=1000, limit=8000)
    assert not p.due(5999, speaking=False)
    assert p.due(6000, speaking=False)
    assert not p.due(6999, speaking=True)  # the reply goes on
    assert p.due(7000, speaking=True)
    assert p.due(9000, speaking=True)
    off = RolloverPolicy(enabled=False, budget=6000, prime=1000, limit=8000)
    assert not off.due(8000, speaking=False)


def test_a_prime_fits_below_the_budget() -> None:
    p = RolloverPolicy(enabled=True, budget=6000, prime=1000, limit=8000)
    assert p.fits(5999) and not p.fits(6000)
