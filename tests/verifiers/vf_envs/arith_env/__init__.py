"""A single-turn verifiers environment written with verifiers' own API: add two numbers.

Rewards: ``correct`` (weight 1) when the reply is the sum, ``brief`` (weight 0.25) when the reply
has at most 8 characters. Data is generated here (no hub download).
"""

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == str(self.data.answer) else 0.0

    @vf.reward(weight=0.25)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 8 else 0.0


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 6


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        pairs = [(i + 2, 3 * i + 1) for i in range(self.config.num_tasks)]
        return [
            ArithTask(ArithData(id=f"add-{a}-{b}", prompt=f"What is {a} + {b}? Reply with the number.", answer=a + b))
            for a, b in pairs
        ]


__all__ = ["ArithTaskset"]
