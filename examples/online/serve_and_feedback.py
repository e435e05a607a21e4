"""agentbolt serve in Python: a live client's call recorded into a session, feedback attached later.

Run: uv run python examples/online/serve_and_feedback.py  (writes serve.db and serve-state/ here)
"""

import asyncio

import httpx
import openai

from agentbolt.online import OnlineServer, SessionOptions
from agentbolt.testing.fake_llm import FakeLLM, FakeLLMServer


async def main() -> None:
    # FakeLLMServer stands in for your model server (vLLM, SGLang, an API): any OpenAI-compatible URL works
    async with FakeLLMServer(FakeLLM(default_reply="Paris.")) as model_server:
        server = OnlineServer(
            "sqlite:///serve.db",  # sessions, calls and rewards: the durable store
            model_server.base_url,  # a URL: serve and record, no training here
            state_dir="serve-state",
            token="s3cret",  # clients send it as their API key
            sessions=SessionOptions(idle_s=300),
        )
        async with server:
            client = openai.AsyncOpenAI(
                base_url=server.url, api_key="s3cret", default_headers={"X-Agentbolt-Session-Id": "chat-42"}
            )
            answer = await client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "What is the capital of France?"}]
            )
            print(answer.choices[0].message.content)

            # later (minutes or days): the user liked it
            feedback = {"feedback_id": "fb-1", "session_id": "chat-42", "reward": 1.0}
            async with httpx.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as http:
                reply = await http.post(f"{server.gateway.url}/v1/feedback", json=feedback)
                print(reply.json()["status"])  # recorded (sending it again answers "duplicate")
                status = await http.get(f"{server.gateway.url}/v1/online/status")
                print(status.json()["metrics"]["online/feedback"])


asyncio.run(main())
