"""The adder environment's MCP tool server (verifiers runs it as ``python -m adder_tools_env.tools``)."""

import verifiers.v1 as vf


class AdderToolset(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b


if __name__ == "__main__":
    AdderToolset.run()
