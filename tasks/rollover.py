"""When a duplex session rolls over into a fresh model session, and with what budgets.

The model's context (``Backend.max_context_tokens``) bounds a session's KV cache. Rather than
end the call when it fills (``context_full``), the worker starts a fresh model session primed
with the conversation so far once the cache passes a budget (``rollover_kv_tokens``), between
two steps. While the model speaks it waits for the end of the reply, so a reply is not cut for
it, unless the cache gets halfway from the budget to the limit: then it rolls over at once and
the reply ends where it was (of it, only what was sent stays in the conversation).
"""

from __future__ import annotations

from dataclasses import dataclass

from omnicore.settings import Settings

DEFAULT_BUDGET_SHARE = 0.75  # of the backend's context: room for the prime and a long reply
DEFAULT_PRIME_SHARE = 0.25  # of the budget: the conversation a prime carries


@dataclass(frozen=True, slots=True)
class RolloverPolicy:
    """The budgets of one worker's duplex sessions (from the settings and its backend)."""

    enabled: bool
    budget: int  # KV cache length that starts a rollover
    prime: int  # tokens of conversation a prime may carry
    limit: int  # the backend's context window

    @classmethod
    def of(cls, settings: Settings, limit: int) -> RolloverPolicy:
        """The policy for a backend whose context holds ``limit`` tokens."""
        budget = settings.rollover_kv_tokens or int(limit * DEFAULT_BUDGET_SHARE)
        budget = max(1, min(budget, limit))
        prime = settings.rollover_prime_tokens or int(budget * DEFAULT_PRIME_SHARE)
        return cls(enabled=settings.rollover, budget=budget, prime=prime, limit=limit)

    def due(self, kv: int, speaking: bool) -> bool:
        """Whether a session whose cache holds ``kv`` tokens rolls over now."""
        if not self.enabled or kv < self.budget:
            return False
        return not speaking or kv >= self.budget + (self.limit - self.budget) // 2

    def fits(self, prompt_length: int) -> bool:
        """Whether a fresh session whose prompt is ``prompt_length`` long can go on: below the
        budget, else it would roll over again at its first step."""
        return prompt_length < self.budget
