"""Tool rendering through chat templates (native and fallback) and tool-call parsing, end to end."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentbolt_torch.chat import (
    ToolCallStreamFilter,
    parse_tool_calls,
    render_chat,
    template_capabilities,
    tools_system_prompt,
)
from agentbolt_torch.generation.engine import GenerationEngine
from agentbolt_torch.policy import Policy
from agentbolt_torch.serving.server import PolicyServer

openai = pytest.importorskip("openai")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]

# SmolLM2-135M-Instruct's own template: it ignores tools and cannot render tool calls.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "What is 3 + 5?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "3 + 5"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "8"},
]


@pytest.fixture
def smol_style_tokenizer(tiny: tuple[Any, Any]) -> Any:
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    return tokenizer


def test_native_template_renders_tools_and_calls(tiny: tuple[Any, Any]) -> None:
    tokenizer = tiny[1]
    assert template_capabilities(tokenizer).tools and template_capabilities(tokenizer).tool_calls
    text = render_chat(tokenizer, CONVERSATION, TOOLS)
    assert '"name": "calculator"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 5"}}\n</tool_call>' in text
    assert "<tool_response>\n8\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_fallback_rendering_for_templates_without_tools(smol_style_tokenizer: Any) -> None:
    caps = template_capabilities(smol_style_tokenizer)
    assert not caps.tools and not caps.tool_calls
    text = render_chat(smol_style_tokenizer, CONVERSATION, TOOLS)
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 5"}}' in text
    assert "<|im_start|>user\n<tool_response>\n8\n</tool_response><|im_end|>" in text
    # without a system message one is added (SmolLM2's default one would not mention tools)
    text2 = render_chat(smol_style_tokenizer, CONVERSATION[1:2], TOOLS)
    assert text2.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n" + tools_system_prompt(TOOLS))


@pytest.mark.parametrize("style", ["native", "fallback"])
def test_rendered_tool_call_parses_back(style: str, tiny: tuple[Any, Any], smol_style_tokenizer: Any) -> None:
    """What the template renders for an assistant tool call is what the parser turns back into it."""
    tokenizer = tiny[1] if style == "native" else smol_style_tokenizer
    prefix = render_chat(tokenizer, CONVERSATION[:2], TOOLS)
    full = render_chat(tokenizer, CONVERSATION[:3], TOOLS, add_generation_prompt=False)
    assert full.startswith(prefix)
    generated = full[len(prefix) :].split("<|im_end|>")[0]
    parsed = parse_tool_calls(generated)
    assert parsed.content is None
    assert len(parsed.tool_calls) == 1
    fn = parsed.tool_calls[0]["function"]
    assert fn["name"] == "calculator"
    assert json.loads(fn["arguments"]) == {"expression": "3 + 5"}
    assert parsed.tool_calls[0]["id"].startswith("call_")


def test_parse_tool_calls_edge_cases() -> None:
    two = (
        'Let me compute.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
    )
    parsed = parse_tool_calls(two)
    assert parsed.content == "Let me compute."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["a", "b"]
    assert json.loads(parsed.tool_calls[1]["function"]["arguments"]) == {"y": 2}
    unclosed = parse_tool_calls('<tool_call>\n{"name": "a", "arguments": {}}\n')
    assert unclosed.tool_calls and unclosed.tool_calls[0]["function"]["arguments"] == "{}"
    bad = '<tool_call>{"name": "a", "arguments": {</tool_call>'
    assert parse_tool_calls(bad).tool_calls == [] and parse_tool_calls(bad).content == bad
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    assert parse_tool_calls(no_name).tool_calls == []
    assert parse_tool_calls("plain text").content == "plain text"


def test_stream_filter_holds_back_tool_calls() -> None:
    text = 'Sure.<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    filt = ToolCallStreamFilter()
    streamed = "".join(filt.feed(ch) for ch in text)
    assert streamed == "Sure."
    rest, calls = filt.finish()
    assert rest == "" and calls[0]["function"]["name"] == "calculator"
    plain = ToolCallStreamFilter()
    streamed = "".join(plain.feed(ch) for ch in "a <tool but not a call")
    rest, calls = plain.finish()
    assert streamed + rest == "a <tool but not a call" and calls == []


class ScriptedLM(torch.nn.Module):
    """Wraps a causal LM so that after the prompt it generates ``script`` then eos (for tests)."""

    def __init__(self, inner: Any, eos: int) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.generation_config = inner.generation_config
        self.eos = eos
        self.script: list[int] = []
        self.prompt_len = 0

    def forward(self, **kwargs: Any) -> Any:
        out = self.inner(**kwargs)
        last_pos = kwargs["position_ids"][:, -1]
        for row, pos in enumerate(last_pos.tolist()):
            k = pos + 1 - self.prompt_len
            target = self.script[k] if 0 <= k < len(self.script) else self.eos
            out.logits[row, -1, :] = -30.0
            out.logits[row, -1, target] = 30.0
        return out


@pytest.fixture
def scripted_server(tiny: tuple[Any, Any]) -> Iterator[tuple[Any, ScriptedLM, Any]]:
    model, tokenizer = tiny
    scripted = ScriptedLM(model, tokenizer.eos_token_id)
    policy = Policy(scripted, tokenizer, name="scripted", autocast_dtype=None)
    with PolicyServer(GenerationEngine(policy, batch_window_s=0)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        yield client, scripted, tokenizer


def test_server_returns_tool_calls(scripted_server: tuple[Any, ScriptedLM, Any]) -> None:
    client, scripted, tokenizer = scripted_server
    messages = CONVERSATION[:2]
    reply = 'I will use the calculator.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 5"}}\n</tool_call>'
    scripted.script = tokenizer(reply, add_special_tokens=False)["input_ids"]
    scripted.prompt_len = len(tokenizer(render_chat(tokenizer, messages, TOOLS), add_special_tokens=False)["input_ids"])
    r = client.chat.completions.create(
        model="scripted", messages=messages, tools=TOOLS, max_tokens=200, extra_body={"return_token_ids": True}
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will use the calculator."
    call = choice.message.tool_calls[0]
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "3 + 5"}
    assert choice.model_dump()["token_ids"] == [*scripted.script, tokenizer.eos_token_id]

    # streaming: content before the call streams; the call arrives as one tool_calls delta
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert content == "I will use the calculator.\n"
    assert finish == "tool_calls"
    assert calls[0].function.name == "calculator" and json.loads(calls[0].function.arguments) == {"expression": "3 + 5"}

    # the agent's next turn (tool result) renders and the model's plain answer comes back as content
    scripted.script = tokenizer("The answer is 8.", add_special_tokens=False)["input_ids"]
    history = [
        *messages,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "8"},
    ]
    scripted.prompt_len = len(tokenizer(render_chat(tokenizer, history, TOOLS), add_special_tokens=False)["input_ids"])
    r2 = client.chat.completions.create(model="scripted", messages=history, tools=TOOLS)
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "The answer is 8."
    # tool_choice="none": tools are not rendered and nothing is parsed
    scripted.script = tokenizer(reply, add_special_tokens=False)["input_ids"]
    scripted.prompt_len = len(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    r3 = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, tool_choice="none")
    assert r3.choices[0].finish_reason == "stop" and r3.choices[0].message.content == reply


def test_tool_choice_forces_a_call_on_the_prompt_side(scripted_server: tuple[Any, ScriptedLM, Any]) -> None:
    """A named tool_choice puts the call's opening into the prompt: the policy samples (and is trained
    on) only the arguments that follow; the reply is parsed with the forced text in front."""
    client, scripted, tokenizer = scripted_server
    messages = CONVERSATION[:2]
    named = {"type": "function", "function": {"name": "calculator"}}
    forced = '<tool_call>\n{"name": "calculator", "arguments":'
    rendered = render_chat(tokenizer, messages, TOOLS) + forced
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    scripted.script = tokenizer(' {"expression": "3 + 5"}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    scripted.prompt_len = len(prompt_ids)
    r = client.chat.completions.create(
        model="scripted",
        messages=messages,
        tools=TOOLS,
        tool_choice=named,
        max_tokens=200,
        extra_body={"return_token_ids": True},
    )
    body = r.model_dump()
    assert body["prompt_token_ids"] == prompt_ids  # the forced text is prompt, not response
    assert body["choices"][0]["token_ids"] == [*scripted.script, tokenizer.eos_token_id]
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "3 + 5"}
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    calls = []
    for chunk in client.chat.completions.create(
        model="scripted", messages=messages, tools=TOOLS, tool_choice=named, stream=True
    ):
        for c in chunk.choices:
            assert not c.delta.content  # the forced opening never streams as text
            calls += c.delta.tool_calls or []
    assert [c.function.name for c in calls] == ["calculator"]
    # "required" opens a call and lets the model name the tool
    scripted.script = tokenizer(
        ' "calculator", "arguments": {"expression": "1"}}\n</tool_call>', add_special_tokens=False
    )["input_ids"]
    scripted.prompt_len = len(
        tokenizer(render_chat(tokenizer, messages, TOOLS) + '<tool_call>\n{"name":', add_special_tokens=False)[
            "input_ids"
        ]
    )
    r2 = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, tool_choice="required")
    assert r2.choices[0].message.tool_calls[0].function.name == "calculator"
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        client.chat.completions.create(
            model="scripted",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
