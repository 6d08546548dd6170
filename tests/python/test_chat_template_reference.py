"""Differential test: runtime/chat (through ltm-render-template) against Python's jinja2, set up as
Hugging Face transformers sets it up, and against Hugging Face's JavaScript engine for chat
templates (@huggingface/jinja under node); see ltm_testing/chat_reference.py.

The templates are written here in the styles of the common model families (ChatML, Llama-3 header
tokens, Llama-2/Mistral [INST] with alternation checks, system-first turn markers, a template
using namespace(), selectattr, slicing and tojson, one with a macro) and rendered over several
conversations, with and without add_generation_prompt; the outputs must be equal byte for byte.
Conversations a template refuses (raise_exception) must be refused by all three with the
template's message. FEATURES are one-line templates covering the rest of the language.

Features marked with a note are where @huggingface/jinja differs from jinja2 (so from transformers);
they are compared with jinja2 only.

Needs: $LTM_RENDER_TEMPLATE, Debian's python3-jinja2, node and tests/node/node_modules
(scripts/setup). A missing one fails the test with a message saying how to get it.
"""

import os
import shutil

import pytest

from ltm_testing import chat_reference as ref

# ---- templates in the styles of the model families -----------------------------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

INST = """{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = messages[0]['content'] %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = false %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message != false %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
        {{ ' '  + content.strip() + ' ' + eos_token }}
    {% endif %}
{% endfor %}
"""

SYSTEM_FIRST = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message['role'] == 'system' -%}
        {{ raise_exception("System role only allowed as the first message") }}
    {%- endif -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

NAMESPACE_TOOLS = """{%- set ns = namespace(system='', n_user=0, last_user=-1, found=false) -%}
{%- for m in messages | selectattr('role', 'equalto', 'system') -%}
  {%- set ns.system = ns.system ~ m.content -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}
    {%- set ns.n_user = ns.n_user + 1 -%}
    {%- set ns.last_user = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for m in messages[::-1] -%}
  {%- if not ns.found and m.role == 'assistant' -%}
    {%- set ns.found = true -%}
    {%- set ns.last_reply = m.content[:12] -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.system %}<|system|>{{ ns.system }}
meta: {{ {'users': ns.n_user, 'roles': messages | map(attribute='role') | list,
          'last_user': ns.last_user, 'reply': ns.last_reply | default(none)} | tojson }}
{% endif -%}
{%- for m in (messages | rejectattr('role', 'equalto', 'system') | list)[-3:] %}
<|{{ m.role }}|>
{{ m.content }}{% if not loop.last %}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{% endif %}
"""

PLAIN_ROLES = """{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first %}{{ message['content'] }}

{% elif message['role'] == 'user' %}User: {{ message['content'] }}

{% else %}Assistant: {{ message['content'] }}{{ eos_token }}{% if not loop.last %}

{% endif %}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}Assistant:{% endif %}
"""

MACRO = """{%- macro turn(role, text, suffix='\\n') -%}
[{{ role | upper }}] {{ text }}{{ suffix }}
{%- endmacro -%}
{{ bos_token }}
{%- for m in messages -%}
{{ turn(m.role, m.content) if m.role != 'system' else turn('sys', m.content | trim, suffix='|') }}
{%- endfor -%}
{%- if add_generation_prompt %}{{ turn('assistant', '', suffix='') }}{% endif %}
"""

FAMILIES = {
    "chatml": CHATML,
    "llama3": LLAMA3,
    "inst": INST,
    "system_first": SYSTEM_FIRST,
    "namespace_tools": NAMESPACE_TOOLS,
    "plain_roles": PLAIN_ROLES,
    "macro": MACRO,
}

CONVERSATIONS = {
    "one_turn": [{"role": "user", "content": "Hello there!"}],
    "system_three_turns": [
        {"role": "system", "content": "  You are a helpful assistant.\n"},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": " Paris. It has been the capital since 987. "},
        {"role": "user", "content": "And of Spain? Answer in «one» word, é ü 中文 🙂."},
    ],
    "two_turns_multiline": [
        {"role": "user", "content": "line one\nline two\n\n  indented\t'quoted' \"double\""},
        {"role": "assistant", "content": "{{ not a tag }} {% neither %}"},
    ],
    # Refused by the templates that check alternation (user, user).
    "not_alternating": [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
    ],
}


def _contexts():
    for conv_name, messages in CONVERSATIONS.items():
        for agp in (False, True):
            yield f"{conv_name}/agp={agp}", {
                "messages": messages,
                "add_generation_prompt": agp,
                "bos_token": "<s>",
                "eos_token": "</s>",
            }


# ---- one-line templates over the rest of the language -------------------------------------------

FEATURE_CONTEXT = {
    "messages": CONVERSATIONS["system_three_turns"],
    "names": ["b", "a", "c"],
    "n": 7,
    "x": 2.5,
    "d": {"b": 1, "a": [1, 2], "c": {"z": None}},
    "flag": True,
    "empty": [],
    "text": "  Hello, Wörld!  ",
}

FEATURES = [
    # whitespace control with trim_blocks and lstrip_blocks
    "a\n  {% if true %}\n  b\n  {% endif %}\nc",
    "a  {%- if true -%}  b  {%- endif %}  c",
    "{{ 'a' }}\n{{ 'b' }}\n  {# comment #}\n  x\n{#- c2 -#}  y",
    ("  {%+ if true %}kept{% endif +%}\nnext", "JS: no {%+ +%}"),
    "{% for i in names %}\n  {{ i }}\n{% endfor %}\nend\n",
    "x {% if flag %}yes{% else %}no{% endif %} y\n\n",
    # arithmetic, comparisons, logic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }} {{ 7 / 2 }}",
    ("{{ -7 % 3 }} {{ 7 % -3 }}", "JS's remainder takes the dividend's sign"),
    "{% if n > 5 and n < 10 and not (n == 8) and (flag or n) %}in{% endif %}",
    ("{{ n > 5 and n < 10 }} {{ 1 < 2 < 3 }} {{ not flag or n == 7 }} {{ n != 7 }}",
     "JS prints true/false, and has no chained comparisons"),
    "{% if 'b' in names and 'z' not in names and 'ell' in 'hello' and 'a' in d %}in{% endif %}",
    "{{ 'a' ~ 1 ~ 'b' }} {{ 'x' if flag else 'y' }} {{ 'a' + 'b' }} {{ ([1, 2] + [3]) | length }}",
    ("{{ 'a' ~ none ~ true }} {{ ('x' if not flag) ~ '|' }}", "JS prints none/undefined otherwise"),
    ("{{ [1, 2] + [3] }} {{ 'ab' * 3 }}", "JS has no list repr and no string repetition"),
    # values and tests
    ("{{ none }} {{ true }} {{ false }} {{ undefined_name }}|", "JS prints true/false"),
    "{% if n is integer and 'a' is string and none is none and d is mapping and names is iterable"
    " and n is odd and not n is even and n is number and flag is boolean"
    " and undefined_name is undefined and n is not none and d.x is not defined %}ok{% endif %}",
    ("{{ 6 is divisibleby(3) }} {{ n is integer }}", "JS: no test arguments, prints true/false"),
    "{{ d['a'][1] }} {{ names[-1] }} {{ names.0 }}{% if d['missing'] is defined %}no{% endif %}",
    ("{{ d.c.z }}", "JS prints None as an empty string"),
    # filters
    "{{ text | trim }}|{{ text | upper }}|{{ text | lower }}|{{ names | length }}|{{ text | length }}",
    "{{ names | join(', ') }} {{ names | first }} {{ names | last }} {{ empty | length }}",
    "{{ messages | map(attribute='role') | join('/') }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list | length }}",
    "{{ (messages | rejectattr('role', 'equalto', 'user') | first).role }}",
    "{{ undefined_name | default('dflt') }} {{ '' | default('e', true) }} {{ n | default(1) }}",
    "{{ n | string ~ '!' }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ 'hello world' | capitalize }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'My title' | title }} {{ 'ÀÉÎ ßtraße ÿ ΑΒΓ Жук' | lower }}"
    " {{ 'àéî ÿ αβγ жук' | upper }}",
    "{% for k, v in d | items %}{{ k }}:{{ v | tojson }};{% endfor %}",
    "{{ names | list | length }}",
    ("{{ 'abc' | list | join(',') }}", "JS: no list filter on strings"),
    "{{ messages[0] | tojson }}",
    "{{ d | tojson }}",
    "{{ d | tojson(indent=2) }}",
    "{{ 'a\"b\\\\ \\n\\té' | tojson }} {{ [1, 'x', none, true] | tojson }}",
    # slicing, methods
    "{{ 'hello'[1:] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ names[1:3] | join }} "
    "{{ names[::-1] | join }} {{ names[::2] | join }} {{ 'hello'[-3:-1] }}",
    "{{ text.strip() }}|{{ text.lstrip() }}|{{ text.rstrip() }}",
    ("{{ 'xxaxx'.strip('x') }}", "JS ignores strip's argument"),
    "{% if 'Hello'.startswith('He') and 'Hello'.endswith('lo') %}ok{% endif %}",
    "{{ 'a,b,,c'.split(',') | length }} "
    "{{ 'a b  c'.split() | join('|') }} {{ 'hello world'.title() }} {{ 'ABC'.lower() }} "
    "{{ 'abc'.upper() }}",
    "{% for k, v in d.items() %}{{ k }}{% endfor %} {{ d.get('b') }} {{ d.get('q', 5) }}",
    # loops
    "{% for c in names %}{{ loop.index }}{{ loop.index0 }}{% if loop.first %}F{% endif %}"
    "{% if loop.last %}L{% endif %}{{ loop.length }}{{ loop.revindex }} {% endfor %}",
    ("{% for c in 'ab' %}{{ loop.first }}{{ c }}{% endfor %}", "JS: no loop over a string"),
    "{% for x in empty %}never{% else %}empty{% endfor %}",
    "{% for x in names %}{% if x == 'a' %}{% continue %}{% endif %}{{ x }}"
    "{% if x == 'a' %}{% break %}{% endif %}{% endfor %}",
    "{% for x in names if x != 'b' %}{{ x }}{{ loop.index }}{% endfor %}",
    "{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 10, 3) %}{{ i }}{% endfor %}",
    # set: scoping, block set, namespace
    "{% set a = 1 %}{% for i in names %}{% set a = a + 1 %}{% endfor %}{{ a }}",
    "{% set ns = namespace(a=1) %}{% for i in names %}{% set ns.a = ns.a + 1 %}{% endfor %}{{ ns.a }}",
    "{% set block %}\n  inner {{ n }}\n{% endset %}[{{ block }}]",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set l = [1, 2, 3] %}{{ l | length }}",
    # dict and list literals
    "{{ {'a': 1, 'b': [1, 2]}['b'][0] }} {{ ['x', 'y'] | join }} {{ {'k': 'v'} | tojson }}",
]


# Templates jinja2 refuses at render time: ltm must refuse them too (checked against jinja2 only).
REFUSED = [
    "{{ missing.attr }}",
    "{{ missing['k'] }}",
    "{{ d.c.z.q.r }}",
    "{{ 1 + 'a' }}",
    "{{ n // 0 }}",
    "{{ raise_exception('boom: ' ~ n) }}",
    "{% for x in n %}{% endfor %}",
    "{% set s = 'x' %}{% set s.a = 1 %}",
    "{{ names < n }}",
]

# ---- the test -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def render_tool():
    tool = os.environ.get("LTM_RENDER_TEMPLATE")
    if not tool or not os.path.exists(tool):
        pytest.fail("$LTM_RENDER_TEMPLATE is not set or missing: build ltm-render-template "
                    "(tests/tools/ltm_render_template.cpp)")
    return tool


def _cases(with_js_divergent):
    """[(name, template, context)]: every family over every conversation, then the features."""
    cases = []
    for fam, source in FAMILIES.items():
        for ctx_name, ctx in _contexts():
            cases.append((f"{fam}/{ctx_name}", source, ctx))
    for i, feature in enumerate(FEATURES):
        source, js_note = (feature, None) if isinstance(feature, str) else feature
        if js_note is None or with_js_divergent:
            cases.append((f"feature[{i}] {source!r}", source, FEATURE_CONTEXT))
    return cases


def _compare(cases, ours, theirs, who):
    """Mismatches as text; a refusal must be the template's own (raise_exception) on both sides."""
    mismatches = []
    for (name, _, _), mine, other in zip(cases, ours, theirs):
        if mine[0] == "error" or other[0] == "error":
            if not (mine[0] == other[0] == "error" and "must alternate" in mine[1]
                    and "must alternate" in other[1]):
                mismatches.append(f"{name}:\n  ltm: {mine!r}\n  {who}: {other!r}")
        elif mine[1] != other[1]:
            mismatches.append(f"{name}:\n  ltm: {mine[1]!r}\n  {who}: {other[1]!r}")
    return mismatches


def test_families_and_features_match_jinja2(render_tool):
    cases = _cases(with_js_divergent=True)
    ours = ref.render_ltm(render_tool, [(s, c) for _, s, c in cases])
    theirs = [ref.render_jinja2(s, c) for _, s, c in cases]
    assert len(ours) == len(theirs) == len(cases)
    mismatches = _compare(cases, ours, theirs, "jinja2")
    assert not mismatches, "\n".join(mismatches)
    # The alternation checks did refuse: inst and system_first on not_alternating, both agp.
    refused = [name for (name, _, _), r in zip(cases, ours) if r[0] == "error"]
    assert len(refused) == 4, refused
    print(f"{len(cases)} renders equal to jinja2's, {len(refused)} refused by raise_exception")


def test_refusals_match_jinja2(render_tool):
    cases = [(src, FEATURE_CONTEXT) for src in REFUSED]
    ours = ref.render_ltm(render_tool, cases)
    for (src, ctx), mine in zip(cases, ours):
        theirs = ref.render_jinja2(src, ctx)
        assert theirs[0] == "error", (src, theirs)
        assert mine[0] == "error", (src, mine)
        assert mine[1].startswith("chat template"), (src, mine)
    assert ours[5] == ("error", "chat template raised: boom: 7")


def test_families_and_features_match_hf_js(render_tool, tmp_path):
    if shutil.which("node") is None:
        pytest.fail("node not found: install Debian's nodejs (scripts/setup)")
    if ref.hf_js_module() is None:
        pytest.fail(f"{ref.HF_JS_DIR} is missing: run scripts/setup (npm packages for tests)")
    # Features where @huggingface/jinja differs from jinja2 (noted beside them) are left out.
    cases = _cases(with_js_divergent=False)
    ours = ref.render_ltm(render_tool, [(s, c) for _, s, c in cases])
    theirs = ref.render_hf_js([(s, c) for _, s, c in cases], str(tmp_path))
    assert len(ours) == len(theirs) == len(cases)
    mismatches = _compare(cases, ours, theirs, "hf-js")
    assert not mismatches, "\n".join(mismatches)
    print(f"{len(cases)} renders equal to @huggingface/jinja's")
