"""A multi-turn tool verifiers environment written with verifiers' own API: the model adds two
numbers with an ``add`` tool (an MCP tool server, :mod:`.tools`), then answers.

Rewards: ``correct`` (weight 1) when the final reply is the sum; metric ``tool_calls``.
"""

import verifiers.v1 as vf

from adder_tools_env.tools import AdderToolset


class AdderData(vf.TaskData):
    a: int
    b: int


class AdderTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AdderTask(vf.Task[AdderData, vf.State, AdderTaskConfig]):
    @classmethod
    def toolsets(cls, config: AdderTaskConfig) -> list[vf.Toolset]:
        return [AdderToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip().endswith(str(self.data.a + self.data.b)) else 0.0

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class AdderConfig(vf.TasksetConfig):
    num_tasks: int = 3
    task: AdderTaskConfig = AdderTaskConfig()


class AdderTaskset(vf.Taskset[AdderTask, AdderConfig]):
    def load(self) -> list[AdderTask]:
        return [
            AdderTask(
                AdderData(
                    id=f"tool-add-{i}",
                    prompt=f"Use the add tool: what is {10 * i + 7} + {i + 5}?",
                    a=10 * i + 7,
                    b=i + 5,
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]


__all__ = ["AdderTaskset"]
