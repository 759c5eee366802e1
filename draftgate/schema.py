"""The Arrow schema of every artifact. Stages write these; gates and audits read them.

Column names are a contract (ARCHITECTURE.md): change them here and nowhere else.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

# Keys a message of the `messages` column may carry, per role: what the prompts stage admits and
# the template shapes (templates/shapes.py) cover. Null-valued keys count as absent: Parquet
# struct columns fill every field a sibling row has with null.
MESSAGE_KEYS = {
    "system": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "reasoning_content"},
    "tool": {"role", "content", "name", "tool_call_id"},
}


def compact_json(obj: Any) -> str:
    """The `messages` and `tools` columns' JSON text (the prompts stage writes it, the contract
    stores its probes the same way). The record's key order is kept: chat templates render tools
    with `tojson` in dict order, so sorting keys would change the prompt the model sees. Only the
    prompt id sorts (prompts.canonical_json)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@cache
def prompts():
    import pyarrow as pa

    return pa.schema([
        ("prompt_id", pa.string()),     # sha256 of canonical messages + tools
        ("dataset", pa.string()),       # the raw file's stem
        ("messages", pa.string()),      # JSON text, OpenAI shape
        ("tools", pa.string()),         # JSON text or null
        ("split", pa.string()),         # train | heldout
        ("source", pa.string()),        # file:line of the first occurrence
        ("n_duplicates", pa.int32()),   # further occurrences collapsed into this row
        # The serving mode it is rendered and generated in: thinking on for a hybrid template
        # (prompts.thinking per dataset, or the record's own field); tools: the tools column.
        ("thinking", pa.bool_()),
    ])


@cache
def rejects():
    import pyarrow as pa

    return pa.schema([
        ("source", pa.string()),        # file:line
        ("reason", pa.string()),        # reason code
        ("detail", pa.string()),        # what was wrong, and the fix
        ("record", pa.string()),        # the raw line (truncated), for review
    ])


@cache
def responses():
    import pyarrow as pa

    return pa.schema([
        ("prompt_id", pa.string()),
        ("dataset", pa.string()),
        ("request_hash", pa.string()),          # sha256 of every param that shapes the output
        ("status", pa.string()),                # ok | failed
        ("failure_reason", pa.string()),        # null when ok
        ("generation_id", pa.string()),
        ("provider", pa.string()),
        ("model", pa.string()),
        ("finish_reason", pa.string()),
        ("native_finish_reason", pa.string()),
        ("reasoning", pa.string()),
        ("reasoning_details", pa.string()),     # JSON text exactly as received, or null
        ("content", pa.string()),
        ("tool_calls", pa.string()),            # JSON text exactly as received, or null
        ("billed_prompt_tokens", pa.int64()),
        ("billed_completion_tokens", pa.int64()),
        ("billed_reasoning_tokens", pa.int64()),
        # Billed over all attempts of the row's journal line: the kept answer plus paid failures.
        ("cost_usd", pa.float64()),
        ("wasted_cost_usd", pa.float64()),      # the part of cost_usd that bought no kept answer
        ("logprobs", pa.string()),              # JSON text or null
        ("truth_ids", pa.list_(pa.int32())),    # only backends that return ids
        ("prompt_token_ids", pa.list_(pa.int32())),  # the prompt as the server tokenised it, or null
        ("attempts", pa.int32()),
        # A secret (the API key) was cut out of the model output: not rebuildable exactly, so
        # reconstruct quarantines the row (secret_in_output). No wall times here: they would change
        # the table's bytes on every run (the journal and metrics keep them).
        ("redacted", pa.bool_()),
    ])


@cache
def tokens():
    import pyarrow as pa

    return pa.schema([
        ("prompt_id", pa.string()),
        ("dataset", pa.string()),
        ("split", pa.string()),
        # The prompt's serving mode as the prompts stage set it (thinking) and its label with the
        # tools (config.mode_name): for reports only; the composition gate recomputes it from the ids.
        ("thinking", pa.bool_()),
        ("mode", pa.string()),
        ("input_ids", pa.list_(pa.int32())),        # prompt + completion
        ("prompt_len", pa.int32()),
        ("completion_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),         # 1 on completion tokens
        ("method", pa.string()),                    # truth | logprobs | text
        ("match", pa.string()),                     # exact | bpe_only | semantic | unknown
        ("first_diff", pa.int32()),                 # first differing completion position, or null
        ("diff_context", pa.string()),              # JSON: both sides around first_diff
        ("n_completion", pa.int32()),
        ("billed_completion_tokens", pa.int64()),
        ("billing_delta", pa.int64()),
        # The provider's measured convention (counts_end | excludes_end: whether its billed count
        # includes the final end token) and the row's delta under it (0 = agrees).
        ("billing_convention", pa.string()),
        ("billing_residual", pa.int64()),
        # Prompt billing: the backend's billed prompt count, the provider's offset (declared or
        # learned: billed = len(prompt ids) + offset) and the row's residual under it.
        ("billed_prompt_tokens", pa.int64()),
        ("prompt_billing_offset", pa.int32()),
        ("prompt_billing_residual", pa.int64()),
        ("prompt_source", pa.string()),             # official (the target's own template) | code
        # The text method's completion ids where they differ from completion_ids (null when
        # equal, or when the text method made the row): the gate's mismatch recount reads them.
        ("text_ids", pa.list_(pa.int32())),
        ("finish_reason", pa.string()),
        ("provider", pa.string()),
        ("ends_with_eos", pa.bool_()),
        ("think_balanced", pa.bool_()),
        ("tool_markers_balanced", pa.bool_()),
        ("special_in_text", pa.bool_()),            # a special id inside a text segment
        ("normalisations", pa.string()),            # JSON list of what provider normalisation did
        ("quarantine_reason", pa.string()),         # null when kept
    ])
