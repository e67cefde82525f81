"""The ik_llama engine renders chat messages exactly as the model's own template does."""

import pytest

from crag_dspy.lm.chat_template import DEFAULT_SYSTEM, render_chatml

jinja2 = pytest.importorskip("jinja2")

# The tool-less part of Qwen2.5-Coder-Instruct's ``tokenizer.chat_template`` (Apache-2.0), as stored in
# the embedded GGUF files: what llama.cpp's server renders for the requests DSPy sends.
QWEN_TEMPLATE = """
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CONVERSATIONS = [
    [
        {"role": "system", "content": "You judge search results."},
        {"role": "user", "content": "question: Q\n\ndocument:\n<<<\nD\n>>>"},
    ],
    [{"role": "user", "content": "Name three colours."}],
    [  # few-shot demos arrive as earlier user/assistant turns
        {"role": "system", "content": "S"},
        {"role": "user", "content": "question: A"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "question: B"},
    ],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "  spaced \n"},
        {"role": "system", "content": "late"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_rendering_matches_the_models_own_template(messages):
    expected = jinja2.Template(QWEN_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    assert render_chatml(messages) == expected


def test_layout():
    assert render_chatml([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chatml([{"role": "user", "content": "U"}], add_generation_prompt=False).startswith(
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
    )


def test_text_parts_are_joined():
    parts = [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]
    assert render_chatml([{"role": "user", "content": parts}]) == render_chatml(
        [{"role": "user", "content": "one two"}]
    )


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "no messages"),
        ([{"role": "tool", "content": "x"}], "unsupported message role 'tool'"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text parts"),
        ([{"role": "user", "content": 3}], "unsupported message content of type int"),
    ],
)
def test_what_the_model_cannot_read_is_refused_by_name(messages, message):
    with pytest.raises(ValueError, match=message):
        render_chatml(messages)
