"""Official-like templates for every variant, and one-line edits of them that must fail the contract.

The official Qwen3 and Kimi files are not copied here (docs/templates.md): each *_LIKE template is
written for the tests in its official file's shape, one Jinja statement per line, and renders what
the code template renders (tests/test_contract_near_miss.py holds it equal on every probe). chatml's
is the real one, read from the SmolLM2 GGUF at test time. A near miss is one realistic edit of one
line, the kind a careless port or a patched model directory makes: (name, family, old, new), `old`
occurring once. Families are the shape families of templates/shapes.py plus `mode` (the thinking
switch); a family the code template refuses outright (chatml: tools, tool calls, reasoning,
thinking; kimi_k2: tool calls, reasoning, thinking) has no near miss: whatever the official
template does there, the prompts stage rejects those prompts before they are rendered.
`blind`: the 25 fixed probes and the seeded corpus (seed 0, 300) pass it; only the covering
corpus shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftgate.official import OfficialTemplate
from draftgate.templates.kimi_tools_ts import deep_sorted, ts_declaration


@dataclass(frozen=True)
class NearMiss:
    name: str
    family: str
    old: str
    new: str
    blind: bool = False

    def apply(self, template: str) -> str:
        assert template.count(self.old) == 1, (self.name, template.count(self.old))
        return template.replace(self.old, self.new)


QWEN3_LIKE = "".join((
    "{%- set ns = namespace(last_query=-1) -%}",
    "{%- for m in messages -%}{%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}",
    "{%- if ns.last_query < 0 -%}{%- set ns.last_query = messages | length - 1 -%}{%- endif -%}",
    "{%- if tools -%}{{ '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' -%}{{ messages[0].content + '\\n\\n' }}{%- endif -%}",
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}",
    "{%- for t in tools -%}{{ '\\n' + (t | tojson) }}{%- endfor -%}",
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}",
    "{%- elif messages[0].role == 'system' -%}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif -%}",
    "{%- for m in messages -%}{%- set content = m.content if m.content is string else '' -%}",
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}{{ '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}",
    "{%- elif m.role == 'assistant' -%}",
    "{%- if m.reasoning_content is string -%}{%- set reasoning = m.reasoning_content -%}",
    "{%- elif '</think>' in content -%}{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}",
    "{%- else -%}{%- set reasoning = '' -%}{%- endif -%}",
    "{{ '<|im_start|>assistant\\n' }}",
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}{{ '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}{%- else -%}{{ content }}{%- endif -%}",
    "{%- for c in m.tool_calls or [] -%}{%- if not loop.first or content -%}{{ '\\n' }}{%- endif -%}",
    "{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments + '}\\n</tool_call>' }}{%- endfor -%}",
    "{{ '<|im_end|>\\n' }}",
    "{%- elif m.role == 'tool' -%}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}",
    "{{ '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}{%- endif -%}",
))

# The three Kimi releases share the body; they differ in the default system turn, the header
# names, reasoning kept in history, and the generation prompt (docs/templates.md).
_KIMI_LAST_PLAIN = (
    "{%- set ns = namespace(last=-1) -%}",
    "{%- for i in range(messages | length - 1, -1, -1) -%}",
    "{%- if messages[i].role == 'assistant' and not messages[i].get('tool_calls') -%}",
    "{%- set ns.last = i -%}{%- break -%}{%- endif -%}{%- endfor -%}",
)
_KIMI_CALLS = (
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>{%- for c in m.tool_calls -%}",
    "<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments }}<|tool_call_end|>",
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}",
)
_KIMI_TOOL_RESULT = ("{%- elif m.role == 'tool' -%}{{ '## Return of ' ~ m.tool_call_id ~ '\\n' }}",
                     "{{ m.content if m.content is string else '' }}")
_KIMI_HEADER = ("{%- if m.role == 'user' -%}<|im_user|>{%- elif m.role == 'assistant' -%}<|im_assistant|>"
                "{%- else -%}<|im_system|>{%- endif -%}{{ m.get('name') or m.role }}<|im_middle|>")

K2_LIKE = "".join((
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}",
    "{%- for m in messages -%}",
    "{%- if loop.first and m.role != 'system' -%}<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>{%- endif -%}",
    "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>",
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>",
    "{%- else -%}<|im_system|>{{ m.role }}<|im_middle|>{%- endif -%}",
    "{{ m.content if m.content is string else '' }}<|im_end|>",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
))

K2_THINKING_LIKE = "".join((
    *_KIMI_LAST_PLAIN,
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}",
    "{%- if messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}",
    "{%- for m in messages -%}",
    _KIMI_HEADER,
    "{%- if m.role == 'assistant' -%}",
    "<think>{{ m.get('reasoning_content', '') if loop.index0 > ns.last else '' }}</think>",
    "{{ m.content if m.content is string else '' }}",
    *_KIMI_CALLS,
    *_KIMI_TOOL_RESULT,
    "{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
))

K25_LIKE = "".join((
    *_KIMI_LAST_PLAIN,
    "{%- set thinking = thinking if thinking is defined else true -%}",
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>",
    "{%- if tools_ts_str is defined and tools_ts_str -%}{{ tools_ts_str }}{%- else -%}{{ tools | tojson(separators=(',', ':')) }}{%- endif -%}",
    "<|im_end|>{%- endif -%}",
    "{%- for m in messages -%}",
    _KIMI_HEADER,
    "{%- if m.role == 'assistant' -%}",
    "<think>{{ m.get('reasoning_content', '') if (loop.index0 > ns.last and thinking) else '' }}</think>",
    "{{ m.content if m.content is string else '' }}",
    *_KIMI_CALLS,
    *_KIMI_TOOL_RESULT,
    "{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>",
    "{%- if thinking -%}<think>{%- else -%}<think></think>{%- endif -%}{%- endif -%}",
))


NEAR_MISSES: dict[str, tuple[NearMiss, ...]] = {
    "chatml": (
        NearMiss("default_system_only_before_a_user", "order", "messages[0]['role'] != 'system'",
                 "messages[0]['role'] == 'user'", blind=True),
        NearMiss("header_writes_the_name", "fields", "'<|im_start|>' + message['role']",
                 "'<|im_start|>' + (message['name'] or message['role'])", blind=True),
        NearMiss("renders_empty_reasoning", "reasoning", "+ message['content'] +",
                 "+ (('<think>' + message['reasoning_content'] + '</think>') if message['reasoning_content'] is defined "
                 "else '') + message['content'] +"),
        NearMiss("trims_content", "text", "+ message['content'] +", "+ message['content'] | trim +"),
    ),
    "qwen3": (
        NearMiss("tool_results_open_a_turn_only_after_an_assistant", "order",
                 "messages[loop.index0 - 1].role != 'tool'", "messages[loop.index0 - 1].role == 'assistant'", blind=True),
        NearMiss("header_writes_the_name", "fields", "'<|im_start|>' + m.role", "'<|im_start|>' + (m.name or m.role)",
                 blind=True),
        NearMiss("system_turn_drops_its_content_beside_tools", "tools", "{{ messages[0].content + '\\n\\n' }}", ""),
        NearMiss("no_newline_between_content_and_first_call", "calls", "{%- if not loop.first or content -%}",
                 "{%- if not loop.first -%}"),
        NearMiss("keeps_empty_reasoning_in_the_loop", "reasoning", "(loop.last or reasoning)",
                 "(loop.last or m.reasoning_content is string)"),
        NearMiss("loop_content_keeps_leading_newlines", "text", "+ content.lstrip('\\n') }}", "+ content }}"),
        NearMiss("wrapped_tool_output_counts_as_a_query", "text", "m.role == 'user' and not (m.content is string and "
                 "m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>'))",
                 "m.role == 'user'", blind=True),
        NearMiss("thinking_off_drops_loop_reasoning", "mode", "(loop.last or reasoning)",
                 "(loop.last or (reasoning and enable_thinking is not false))"),
    ),
    "kimi_k2": (
        NearMiss("default_system_only_before_a_user", "order", "loop.first and m.role != 'system'",
                 "loop.first and m.role == 'user'", blind=True),
        NearMiss("header_writes_the_name", "fields", "<|im_user|>user<|im_middle|>",
                 "<|im_user|>{{ m.get('name') or 'user' }}<|im_middle|>", blind=True),
        NearMiss("tools_as_compact_json", "tools", "{{ tools | tojson }}", "{{ tools | tojson(separators=(',', ':')) }}"),
    ),
    "kimi_k2_thinking": (
        NearMiss("default_system_only_before_a_user", "order", "messages[0].role != 'system'",
                 "messages[0].role == 'user'", blind=True),
        NearMiss("empty_name_kept", "fields", "m.get('name') or m.role", "m.get('name', m.role)", blind=True),
        NearMiss("tools_as_compact_json", "tools", "{{ tools | tojson }}", "{{ tools | tojson(separators=(',', ':')) }}"),
        NearMiss("call_ids_renumbered_per_turn", "calls", "<|tool_call_begin|>{{ c.id }}",
                 "<|tool_call_begin|>functions.{{ c.function.name }}:{{ loop.index0 }}"),
        NearMiss("last_plain_reply_keeps_its_reasoning", "reasoning", "if loop.index0 > ns.last else",
                 "if loop.index0 >= ns.last else"),
        NearMiss("break_removed", "reasoning", "{%- break -%}", ""),
    ),
    "kimi_k25": (
        NearMiss("default_system_turn_added", "order", "{%- for m in messages -%}",
                 "{%- if messages[0].role == 'assistant' -%}<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>"
                 "{%- endif -%}{%- for m in messages -%}", blind=True),
        NearMiss("empty_name_kept", "fields", "m.get('name') or m.role", "m.get('name', m.role)", blind=True),
        NearMiss("typescript_declaration_ignored", "tools", "{%- if tools_ts_str is defined and tools_ts_str -%}",
                 "{%- if false -%}"),
        NearMiss("call_ids_renumbered_per_turn", "calls", "<|tool_call_begin|>{{ c.id }}",
                 "<|tool_call_begin|>functions.{{ c.function.name }}:{{ loop.index0 }}"),
        NearMiss("last_plain_reply_keeps_its_reasoning", "reasoning", "if (loop.index0 > ns.last and thinking)",
                 "if (loop.index0 >= ns.last and thinking)"),
        NearMiss("thinking_off_keeps_loop_reasoning", "mode", "(loop.index0 > ns.last and thinking)",
                 "(loop.index0 > ns.last)"),
    ),
}


class KimiRenderer:
    """Kimi's tokenizer hook (tokenization_kimi.py): tools deep-sorted, and for K2.5 declared the
    TypeScript way as `tools_ts_str`, before its Jinja renders."""

    def __init__(self, hf, typescript: bool):
        self.hf, self.typescript = hf, typescript

    def apply_chat_template(self, messages, tools=None, **kwargs):
        if tools:
            tools = deep_sorted(tools)
            if self.typescript:
                kwargs["tools_ts_str"] = ts_declaration(tools)
        return self.hf.apply_chat_template(messages, tools=tools, **kwargs)


def official_like(name: str, text: str, qwen3_tok, kimi_standin_tok) -> OfficialTemplate:
    if name == "qwen3":
        renderer = qwen3_tok.hf
    else:
        renderer = KimiRenderer(kimi_standin_tok.hf, typescript=name == "kimi_k25")
    return OfficialTemplate(f"test: {name}-like", "-", None, renderer, text)


LIKE = {"qwen3": QWEN3_LIKE, "kimi_k2": K2_LIKE, "kimi_k2_thinking": K2_THINKING_LIKE, "kimi_k25": K25_LIKE}
