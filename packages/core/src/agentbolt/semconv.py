"""Span semantic conventions: the attribute and span names agentbolt reads and writes.

**Two generations of the OpenTelemetry GenAI conventions are read.** Instrumentations emit
either the conventions up to semantic-conventions 1.36 (their default) or the latest ones (with
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``; since semantic-conventions 1.41
the GenAI conventions live in their own repository, ``semantic-conventions-genai``). agentbolt
writes the latest names and reads both (:data:`LEGACY_ALIASES` maps old names to new ones):

======================================  ==============================================  =====================
up to 1.36                              latest                                          read as
======================================  ==============================================  =====================
``gen_ai.system``                       ``gen_ai.provider.name``                        provider
``gen_ai.usage.prompt_tokens`` /        ``gen_ai.usage.input_tokens`` /                 usage
``completion_tokens``                   ``output_tokens``
``gen_ai.openai.request.seed``          ``gen_ai.request.seed``                         seed
``gen_ai.request.top_k`` (double)       ``gen_ai.request.top_k`` (int)                  an int when integral
messages as span events                 ``gen_ai.input.messages`` /                     input / output
(``gen_ai.user.message``, ...,          ``gen_ai.output.messages`` (JSON, ``parts``)    messages
``gen_ai.choice``)
``invoke_workflow`` span,               ``invoke_agent`` (internal) span; a workflow    agent span
``gen_ai.workflow.name``                keeps ``gen_ai.operation.name=invoke_workflow``
                                        and names itself with ``gen_ai.agent.name``
======================================  ==============================================  =====================

Generic fields use the OpenTelemetry GenAI names (``gen_ai.*``); our own namespace
``agentbolt.*`` holds only what reinforcement learning needs (rollout/attempt ids, token ids,
logprobs, rewards, policy version). The deprecated ``gen_ai.prompt`` / ``gen_ai.completion``
attributes are never written.

Every span stored by agentbolt carries :data:`SCHEMA_VERSION` (``Span.schema_version``) so
readers can tell which version of these conventions produced it.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = "1.0"
"""Version of these conventions. Bumped on any incompatible change to names or encodings."""

# --- OpenTelemetry GenAI (generic fields) -----------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""``chat``, ``text_completion``, ``execute_tool``, ``invoke_agent``, ``create_agent``."""
GEN_AI_SYSTEM: Final = "gen_ai.system"
"""The provider, up to semantic-conventions 1.36 (renamed :data:`GEN_AI_PROVIDER_NAME`)."""
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
"""The provider, in the latest GenAI conventions."""
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
"""Top-k sampling: a double up to 1.36, an int in the latest conventions."""
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_WORKFLOW_NAME: Final = "gen_ai.workflow.name"
"""A workflow's name, before the latest conventions merged workflows into ``invoke_agent`` spans."""
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
"""System instructions kept apart from ``gen_ai.input.messages`` (latest conventions)."""
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_DESCRIPTION: Final = "gen_ai.agent.description"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
"""JSON-encoded list of input messages."""
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
"""JSON-encoded list of output messages."""
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"

# Values of gen_ai.operation.name
OP_CHAT: Final = "chat"
OP_TEXT_COMPLETION: Final = "text_completion"
OP_GENERATE_CONTENT: Final = "generate_content"
OP_EXECUTE_TOOL: Final = "execute_tool"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CREATE_AGENT: Final = "create_agent"
OP_INVOKE_WORKFLOW: Final = "invoke_workflow"
"""A workflow: its own span kind up to semantic-conventions 1.41, an ``invoke_agent`` span since."""
OP_EMBEDDINGS: Final = "embeddings"

# Names up to semantic-conventions 1.36 that the latest conventions renamed (old -> new).
LEGACY_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
LEGACY_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.completion_tokens"
LEGACY_OPENAI_REQUEST_SEED: Final = "gen_ai.openai.request.seed"
LEGACY_ALIASES: Final = {
    GEN_AI_SYSTEM: GEN_AI_PROVIDER_NAME,
    LEGACY_USAGE_INPUT_TOKENS: GEN_AI_USAGE_INPUT_TOKENS,
    LEGACY_USAGE_OUTPUT_TOKENS: GEN_AI_USAGE_OUTPUT_TOKENS,
    LEGACY_OPENAI_REQUEST_SEED: GEN_AI_REQUEST_SEED,
    GEN_AI_WORKFLOW_NAME: GEN_AI_AGENT_NAME,
}
"""Attribute names of the GenAI conventions up to 1.36 (and 1.41's workflow name) -> the latest name."""
LEGACY_MESSAGE_EVENTS: Final = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
"""Span events that carried input messages up to semantic-conventions 1.36 (event name -> role)."""
LEGACY_CHOICE_EVENT: Final = "gen_ai.choice"
"""Span event that carried an output message up to semantic-conventions 1.36."""

# Standard OpenTelemetry exception attributes (on exception events and spans).
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
ERROR_TYPE: Final = "error.type"

# --- agentbolt.* (what RL needs) ---------------------------------------------------------------
ROLLOUT_ID: Final = "agentbolt.rollout_id"
"""Rollout id; on spans and as an OTLP resource attribute to route spans to a rollout."""
ATTEMPT_ID: Final = "agentbolt.attempt_id"
"""Attempt id; on spans and as an OTLP resource attribute."""
SCHEMA_VERSION_ATTR: Final = "agentbolt.schema_version"

# LLM-call spans written by the gateway.
PROMPT_TOKEN_IDS: Final = "agentbolt.llm.prompt_token_ids"
"""Exact prompt token ids as the inference backend saw them (list of int)."""
RESPONSE_TOKEN_IDS: Final = "agentbolt.llm.response_token_ids"
"""Exact generated token ids (list of int)."""
RESPONSE_LOGPROBS: Final = "agentbolt.llm.response_logprobs"
"""Logprob of each generated token under the sampling policy (list of float)."""
TOKEN_SOURCE: Final = "agentbolt.llm.token_source"
"""How token ids were obtained: ``exact`` (from the backend), ``retokenized`` or ``missing``.
Only the gateway writes it: LightningRL recognises gateway spans by it, so adapters must not."""
POLICY_VERSION: Final = "agentbolt.llm.policy_version"
"""Resources version (policy weights) that served the call."""
POLICY_NAME: Final = "agentbolt.llm.policy"
"""With policies by role (:mod:`agentbolt.policies`): the policy (adapter) that served the call,
as the upstream reported it (``X-Agentbolt-Policy``) or, failing that, as the gateway routed it;
absent when the call went to the base model or when one shared policy serves every call."""
LLM_LATENCY_S: Final = "agentbolt.llm.latency_s"
LLM_STREAM: Final = "agentbolt.llm.stream"
LLM_UPSTREAM: Final = "agentbolt.llm.upstream"
LLM_CHOICE_INDEX: Final = "agentbolt.llm.choice_index"
LLM_REQUEST: Final = "agentbolt.llm.request"
"""JSON of the request body as forwarded upstream."""
LLM_RESPONSE: Final = "agentbolt.llm.response"
"""JSON of the response body as returned to the client (assembled for streams)."""
LLM_REQUEST_FINGERPRINT: Final = "agentbolt.llm.request_fingerprint"
"""``[full, tail]`` fingerprints of the request's messages (:mod:`agentbolt.request_fingerprint`):
LightningRL joins a framework LLM span to the gateway call whose fingerprint its input messages have."""

LLM_API: Final = "agentbolt.llm.api"
"""API the client spoke when the gateway translated it to Chat Completions (``responses``, ``messages``)."""
TOKEN_DRIFT: Final = "agentbolt.llm.token_drift"
"""On retokenized calls only: why the retokenized ids disagree with what the backend reported
(token counts in ``usage``, the text round trip); absent when they agree. LightningRL excludes such calls."""
TOKEN_MISSING_REASON: Final = "agentbolt.llm.token_missing_reason"
"""On calls with ``token_source = "missing"`` whose ids agentbolt tried to rebuild (traced calls,
:mod:`agentbolt.traces`): why it could not (no tokenizer, no messages recorded...). LightningRL
reports it with the ``no_token_ids`` exclusion."""
CAPTURE_ADAPTERS: Final = "agentbolt.capture.adapters"
"""On a runner's ``agentbolt.capture`` span: names of the adapters instrumented for the attempt."""
CAPTURE_ADAPTER_FAILURES: Final = "agentbolt.capture.adapter_failures"
"""On a runner's ``agentbolt.capture`` span: ``"name: why"`` of each adapter that failed to instrument."""
SPAN_CAPTURE: Final = "agentbolt.capture"
"""Span a runner writes once per attempt when adapters are installed: which ones record, which failed."""

TOKEN_SOURCE_EXACT: Final = "exact"
TOKEN_SOURCE_RETOKENIZED: Final = "retokenized"
TOKEN_SOURCE_MISSING: Final = "missing"

# Rewards and other emitted records.
REWARD_VALUE: Final = "agentbolt.reward.value"
"""The primary reward value (float)."""
REWARD_PRIMARY: Final = "agentbolt.reward.primary"
"""Name of the primary reward dimension."""
REWARD_DIMENSIONS: Final = "agentbolt.reward.dimensions"
"""JSON object of all named reward dimensions ``{name: value}``."""
REWARD_TARGET_SPAN_ID: Final = "agentbolt.reward.target_span_id"
"""Optional explicit target: the span id of the LLM call this reward belongs to."""
REWARD_TARGET_RESPONSE_ID: Final = "agentbolt.reward.target_response_id"
"""Optional explicit target: the ``gen_ai.response.id`` of the LLM call this reward belongs to."""
REWARD_IS_FINAL: Final = "agentbolt.reward.final"
"""True when this reward is the episode's final reward (e.g. the agent's return value)."""
FEEDBACK_ID: Final = "agentbolt.feedback.id"
"""On a reward span recorded from ``POST /v1/feedback`` (or a judge): the feedback id."""
FEEDBACK_SOURCE: Final = "agentbolt.feedback.source"
"""Who gave the reward: ``client`` (the feedback API) or ``judge``."""
FEEDBACK_FINGERPRINT: Final = "agentbolt.feedback.fingerprint"
"""Hash of the feedback's content: a repeated feedback id with other content is refused."""
FEEDBACK_COMMENT: Final = "agentbolt.feedback.comment"
"""Free text sent with the feedback (or the judge's reasoning)."""
MESSAGE_BODY: Final = "agentbolt.message.body"
OBSERVATION_BODY: Final = "agentbolt.observation.body"
OBJECT_JSON: Final = "agentbolt.object.json"
OBJECT_TYPE: Final = "agentbolt.object.type"
OPERATION_NAME: Final = "agentbolt.operation.name"
OPERATION_INPUT: Final = "agentbolt.operation.input"
OPERATION_OUTPUT: Final = "agentbolt.operation.output"
ADAPTER: Final = "agentbolt.adapter"
"""Name of the framework adapter that recorded (or marked) a span."""
SPAN_KIND_ATTR: Final = "agentbolt.span.kind"
"""Our classification of a span: one of the ``KIND_*`` values below."""

KIND_LLM: Final = "llm"
KIND_AGENT: Final = "agent"
KIND_TOOL: Final = "tool"
KIND_REWARD: Final = "reward"
KIND_MESSAGE: Final = "message"
KIND_OBSERVATION: Final = "observation"
KIND_OBJECT: Final = "object"
KIND_EXCEPTION: Final = "exception"
KIND_OPERATION: Final = "operation"
KIND_HANDOFF: Final = "handoff"

# Handoffs between agents (adapters for frameworks that have them).
HANDOFF_FROM_AGENT: Final = "agentbolt.handoff.from_agent"
HANDOFF_TO_AGENT: Final = "agentbolt.handoff.to_agent"

# Span names written by agentbolt itself.
SPAN_LLM_CALL: Final = "agentbolt.llm"
SPAN_REWARD: Final = "agentbolt.reward"
SPAN_MESSAGE: Final = "agentbolt.message"
SPAN_OBSERVATION: Final = "agentbolt.observation"
SPAN_OBJECT: Final = "agentbolt.object"
SPAN_EXCEPTION: Final = "agentbolt.exception"
SPAN_OPERATION: Final = "agentbolt.operation"
