/**
 * MCP tools for the dataset environments: a {@link Toolbox}'s tools as `ToolEnv` tools, so a
 * legacy `ToolEnv` can offer an MCP server's tools (`<toolset>_<tool>`). A tool's error is
 * thrown, so the environment returns it to the model as it does for its own tools.
 *
 * ```ts
 * const box = await Toolbox.open([{ name: "fs", command: "my-mcp-server" }], { state: {} });
 * const env = new ToolEnv({ dataset, tools: mcpTools(box) });
 * // ... evaluate, then:
 * await box.close();
 * ```
 * @module
 */
import type { ToolSpec } from "../legacy/tool_env.ts";
import type { Toolbox } from "./toolbox.ts";

/** The toolbox's tools as `ToolEnv` tools. */
export function mcpTools(toolbox: Toolbox): ToolSpec[] {
  return toolbox.tools.map((tool) => ({
    name: tool.name,
    description: tool.description,
    parameters: tool.parameters,
    fn: async (args: Record<string, unknown>) => {
      const result = await toolbox.call(tool.name, args ?? {});
      if (result.isError) throw new Error(result.text);
      return result.text;
    },
  }));
}
