"""Spend control: a request is only sent when spent + every in-flight worst case stays in budget.

Worst case of one request = estimated prompt tokens + max_tokens, at the price table (OpenRouter
reserves the same against the balance). The prompt estimate is deliberately high: one token per
3 characters of the messages+tools JSON (real tokenizers average ~4 on English, ~3 on code) plus
8 per message for the template. Actual cost is usage.cost when the API reports it, else the
billed tokens at the price table. Attempts that were billed but bought no kept answer (an empty
or junk 200, an error body of any status that carries usage) count as spent too, and as wasted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftgate.client.request import Prompt
from draftgate.config import PriceParams

CHARS_PER_TOKEN_HIGH = 3
TEMPLATE_TOKENS_PER_MESSAGE = 8


def prompt_tokens_high(prompt: Prompt) -> int:
    return -(-prompt.chars // CHARS_PER_TOKEN_HIGH) + TEMPLATE_TOKENS_PER_MESSAGE * len(prompt.messages)


def price_of(price: PriceParams, prompt_tokens: float, completion_tokens: float) -> float:
    return (prompt_tokens * price.prompt_usd_per_mtok + completion_tokens * price.completion_usd_per_mtok) / 1e6


def cost_of(usage: dict[str, Any] | None, price: PriceParams) -> float:
    """What one answer cost: the API's own figure, else its billed tokens at the price table."""
    if not usage:
        return 0.0
    cost = usage.get("cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        return float(cost)
    return price_of(price, usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)


@dataclass
class Budget:
    limit_usd: float          # 0 = no budget
    price: PriceParams
    max_tokens: int
    spent: float = 0.0
    reserved: float = 0.0

    def worst_case(self, prompt: Prompt) -> float:
        return price_of(self.price, prompt_tokens_high(prompt), self.max_tokens)

    def fits(self, amount: float) -> bool:
        return self.limit_usd <= 0 or self.spent + self.reserved + amount <= self.limit_usd

    def reserve(self, amount: float) -> None:
        self.reserved += amount

    def settle(self, reserved: float, cost: float) -> None:
        self.reserved -= reserved
        self.spent += cost
