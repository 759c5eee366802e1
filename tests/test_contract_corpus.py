"""The template contract's generated corpus: what it covers, and a near-miss it catches.

The near-miss is the official Kimi-K2-Thinking template with one `{%- break -%}` removed (a
patched copy in circulation): its search for the last plain assistant reply then stops at the
FIRST one, so reasoning of later finished replies leaks into the prompt. The official file is not
copied here; K2_THINKING_LIKE is a template written for this test with the same logic (a reverse
loop with a break) and the Kimi tokenizer's deep sort of tools in front, rendered by transformers'
Jinja on the Kimi stand-in tokenizer. Checked offline against the official file itself (seed 0,
300 conversations): official 122 compared, 0 differ; without its break 0 of the 14 comparable
fixed probes differ and 67 of the 122 corpus conversations do.
"""

from __future__ import annotations

import time

from draftgate.contract import check_template
from draftgate.official import OfficialTemplate, official_template
from draftgate.templates import get_template
from draftgate.templates.corpus import corpus_summary, generated_corpus
from draftgate.templates.kimi_tools_ts import deep_sorted
from draftgate.templates.probes import PROBES
from draftgate.templates.shapes import covering_corpus
from test_official import run_template_gate

K2_THINKING_LIKE = "".join((
    "{%- set ns = namespace(last=-1) -%}",
    "{%- for i in range(messages | length - 1, -1, -1) -%}",
    "{%- if messages[i].role == 'assistant' and not messages[i].get('tool_calls') -%}",
    "{%- set ns.last = i -%}{%- break -%}{%- endif -%}{%- endfor -%}",
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}",
    "{%- if not messages or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>"
    "You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}",
    "{%- for m in messages -%}",
    "{%- if m.role == 'user' -%}<|im_user|>{%- elif m.role == 'assistant' -%}<|im_assistant|>"
    "{%- else -%}<|im_system|>{%- endif -%}{{ m.get('name') or m.role }}<|im_middle|>",
    "{%- if m.role == 'assistant' -%}",
    "<think>{{ m.get('reasoning_content', '') if loop.index0 > ns.last else '' }}</think>",
    "{{ m.content if m.content is string else '' }}",
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>{%- for c in m.tool_calls -%}",
    "<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments }}<|tool_call_end|>",
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}",
    "{%- elif m.role == 'tool' -%}{{ '## Return of ' ~ m.tool_call_id ~ '\\n' }}",
    "{{ m.content if m.content is string else '' }}",
    "{%- elif m.content is string -%}{{ m.content }}{%- endif -%}<|im_end|>",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
))
NEAR_MISS = K2_THINKING_LIKE.replace("{%- break -%}", "", 1)


class DeepSortingRenderer:
    """Kimi's tokenizer deep-sorts the tool dicts before its Jinja sees them (tokenization_kimi.py)."""

    def __init__(self, hf):
        self.hf = hf

    def apply_chat_template(self, messages, tools=None, **kwargs):
        return self.hf.apply_chat_template(messages, tools=deep_sorted(tools) if tools else None, **kwargs)


def kimi_like(tok, text: str) -> OfficialTemplate:
    return OfficialTemplate("test: K2-Thinking-like", "-", None, DeepSortingRenderer(tok.hf), text)


CORPUS = generated_corpus(0, 300)
SHAPES = covering_corpus()


def test_the_corpus_is_the_same_for_a_seed_and_another_for_another_seed():
    assert generated_corpus(0, 300) == CORPUS
    assert generated_corpus(1, 300) != CORPUS
    assert len({p.name for p in PROBES + CORPUS}) == len(PROBES) + 300


def test_the_corpus_covers_what_the_fixed_probes_have_too_few_of():
    s = corpus_summary(CORPUS)
    # Seed 0's figures (docs/templates.md): every class is there by the dozen, not once.
    assert s["conversations"] == 300 and 100 <= s["thinking_off"] <= 200
    for key in ("with_tools", "parallel_calls", "tool_loop_after_plain_turn", "two_plain_replies_with_reasoning",
                "none_content", "empty_content", "non_ascii"):
        assert s[key] >= 50, key


def test_a_k2_thinking_like_template_equals_the_code_template_on_probes_and_corpus(tmp_path, kimi_standin_tok):
    result = check_template(get_template("kimi_k2_thinking"), kimi_like(kimi_standin_tok, K2_THINKING_LIKE),
                            PROBES + CORPUS + SHAPES)
    assert result.ok and result.complete and result.compared >= 100
    assert run_template_gate(tmp_path, result) == (0, set())


def test_the_near_miss_without_its_break_passes_every_fixed_probe_but_fails_the_corpus(tmp_path, kimi_standin_tok):
    t, near = get_template("kimi_k2_thinking"), kimi_like(kimi_standin_tok, NEAR_MISS)
    assert NEAR_MISS != K2_THINKING_LIKE
    fixed = check_template(t, near, PROBES)
    assert fixed.ok and fixed.compared >= 10          # the blind spot the corpus closes
    started = time.perf_counter()
    result = check_template(t, near, PROBES + CORPUS + SHAPES)
    assert time.perf_counter() - started < 5           # ~0.4 s measured on one core
    bad = [p for p in result.probes if not p.ok]
    assert len(bad) >= 20 and all(p.probe.startswith(("corpus_", "shape_")) for p in bad)
    # What leaks is reasoning of an earlier finished reply: the official render has more text.
    assert all(len(p.official_text) > len(p.code_text) for p in bad)
    code, failed = run_template_gate(tmp_path, result)
    assert code == 1 and failed == {"differs"}


def test_the_default_chatml_template_equals_the_ggufs_on_the_plain_part_of_the_corpus(smollm2_tok):
    result = check_template(get_template("chatml"), official_template(smollm2_tok, "smollm2"), CORPUS)
    assert result.ok and result.compared >= 50
