"""Spend control: a request is only sent when spent + every reserved worst case stays in budget.

The budget bounds the journal, not a run: `generate.budget_usd` is the most the whole journal
may cost, every run and every billed attempt included. A rerun starts from what the journal
already spent (`journal_cost`), so three reruns at $0.002 spend $0.002 in all, not $0.006.

The rule (write-ahead; journal.py has the line format):
- Before every HTTP request, a first try or a retry, what it adds to the reservations must fit:
  spent + reserved + extra <= budget_usd, else it waits for prompts in progress to settle and, if
  it still does not fit, is not sent (a retry's prompt then fails with reason `budget`, kind
  `stopped`, and is tried again by a rerun) and the run stops scheduling. A first try adds its
  worst case; a retry its worst case less what its prompt's earlier attempts left of their
  reservations (their worst cases minus their costs, a lost answer costing its worst case).
- The worst case is reserved in memory and in the journal (a reservation line, fsynced) before
  the request goes out. A prompt's reservations stay held until its finished line is durable;
  only then do they turn into what its attempts cost. So at every instant what the journal would
  show after a `kill -9` (settled lines + unsettled reservations at worst case) is what this
  accounting counted, and it is within the budget.
- A rerun counts every reservation no finished line settled at its worst case, for good: the
  killed run sent (or was about to send) that request, and the provider may have billed it.
- The bound holds at the price table: an answer billed above its worst case (generate.price
  below the real price, or a prompt far denser than 3 characters a token) moves spent past its
  reservation, and the next request is refused, but what was in flight can pass the budget by that
  excess.

Semantics of `budget_usd` (ranges in config.py refuse a negative one):
- > 0: the bound. The stage prints spent / left before sending; when the next request's worst
  case no longer fits, scheduling stops and the message says the total and the budget to set.
- 0: no budget. Allowed only for a free backend: `local`, or `openai` at a zero price (a server
  of your own). A paid price with no budget, or `openrouter` without a price or a budget, is
  refused before anything is sent (`budget_problem`): OpenRouter bills every request, and the
  price is what lets the budget reserve worst cases and count lost answers.

Worst case of one request = estimated prompt tokens + max_tokens, at the price table (OpenRouter
reserves the same against the balance). The prompt estimate is deliberately high: one token per
3 characters of the messages+tools JSON (real tokenizers average ~4 on English, ~3 on code) plus
8 per message for the template.

What an attempt costs:
- an answer or an error body that carries usage: usage.cost when the API reports it, else the
  billed tokens at the price table. Billed attempts that bought no kept answer (an empty or junk
  200, an error body of any status with usage) count as spent and as wasted.
- a lost answer, whose bill we never saw: a timeout, a connection dropped after the request went
  out, a 2xx whose body or usage cannot be read. The provider may have generated and billed it
  (POST is not idempotent), so it counts at its worst case (`worst_case_usd` in the failed
  attempt's entry), exactly what was reserved for it.
  Only a refused connection (`connect`) certainly sent nothing.
- an HTTP error status without usage: 0 (OpenRouter does not bill failed requests).
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


def worst_case(prompt: Prompt, price: PriceParams, max_tokens: int) -> float:
    return price_of(price, prompt_tokens_high(prompt), max_tokens)


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


def line_cost(rec: dict[str, Any]) -> float:
    """Everything one journal line's attempts cost: the kept answer plus wasted (billed or lost)."""
    kept = rec.get("cost_usd") if rec.get("status") == "ok" else 0.0
    return float(kept or 0.0) + float(rec.get("wasted_cost_usd") or 0.0)


def journal_cost(records: list[dict[str, Any]]) -> float:
    """What the journal has cost so far: every line, whatever its request hash or run."""
    return sum(line_cost(r) for r in records)


def budget_problem(gp: Any) -> str | None:
    """Why these params may not send anything, or None. See the module docstring."""
    if gp.backend == "openrouter" and gp.price.free:
        return ("generate.price is zero but backend openrouter bills every request: set "
                "generate.price.prompt_usd_per_mtok and completion_usd_per_mtok (the model's prices), so the "
                "budget can reserve each request's worst case and count lost answers at it")
    if gp.budget_usd == 0 and not gp.price.free:
        return ("generate.budget_usd is 0 (no budget) but requests are paid (backend "
                f"{gp.backend}, generate.price set): set generate.budget_usd to the most the journal may cost "
                "in total, over every run (0 means no budget only for a free backend)")
    return None


@dataclass
class Budget:
    limit_usd: float          # 0 = no budget (free backends only: budget_problem)
    price: PriceParams
    max_tokens: int
    spent: float = 0.0        # the whole journal's: earlier runs' lines + this run's
    reserved: float = 0.0

    def worst_case(self, prompt: Prompt) -> float:
        return worst_case(prompt, self.price, self.max_tokens)

    def fits(self, amount: float) -> bool:
        return self.limit_usd <= 0 or self.spent + self.reserved + amount <= self.limit_usd

    def reserve(self, amount: float) -> None:
        self.reserved += amount

    def settle(self, reserved: float, cost: float) -> None:
        self.reserved -= reserved
        self.spent += cost
