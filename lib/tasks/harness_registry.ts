/**
 * The built-in harnesses by id (`--env.<role>.harness.id`).
 * @module
 */
import { ConfigError } from "../errors.ts";
import { BashHarness, type Harness, NullHarness } from "./harness.ts";
import { ProgramHarness, type ProgramHarnessOptions } from "./program.ts";
import type { AgentCliOptions } from "./agent_cli/cli_harness.ts";
import { ClaudeCodeHarness } from "./agent_cli/claude_code.ts";
import { CodexHarness } from "./agent_cli/codex.ts";
import { OpencodeHarness } from "./agent_cli/opencode.ts";
import { PiHarness } from "./agent_cli/pi.ts";
import { QwenCodeHarness } from "./agent_cli/qwen_code.ts";

/** Built-in harnesses by id. */
export const HARNESSES: Record<string, (config: Record<string, unknown>) => Harness> = {
  bash: (config) => new BashHarness({ edit: config.edit as boolean | undefined }),
  null: () => new NullHarness(),
  program: (config) => new ProgramHarness(config as ProgramHarnessOptions),
  "claude-code": (config) => new ClaudeCodeHarness(config as AgentCliOptions).validate(),
  codex: (config) => new CodexHarness(config as AgentCliOptions).validate(),
  opencode: (config) => new OpencodeHarness(config as AgentCliOptions).validate(),
  pi: (config) => new PiHarness(config as AgentCliOptions).validate(),
  "qwen-code": (config) => new QwenCodeHarness(config as AgentCliOptions).validate(),
};

/** A harness by id; unknown ids list the known ones. */
export function getHarness(id: string, config: Record<string, unknown> = {}): Harness {
  const make = HARNESSES[id];
  if (!make) {
    throw new ConfigError(
      `Unknown harness "${id}"; known: ${Object.keys(HARNESSES).map((h) => `"${h}"`).join(", ")}`,
    );
  }
  return make(config);
}
