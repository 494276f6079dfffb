/**
 * The built-in harnesses by id (`--env.<role>.harness.id`).
 * @module
 */
import { ConfigError } from "../errors.ts";
import { BashHarness, type Harness, NullHarness } from "./harness.ts";
import { ProgramHarness } from "./program.ts";
import { ClaudeCodeHarness } from "./agent_cli/claude_code.ts";
import { CodexHarness } from "./agent_cli/codex.ts";
import { OpencodeHarness } from "./agent_cli/opencode.ts";
import { PiHarness } from "./agent_cli/pi.ts";
import { QwenCodeHarness } from "./agent_cli/qwen_code.ts";

/**
 * A harness's `[env.<role>.harness]` table as the config gives it. Every harness's options
 * are optional keys, so the table is one as it stands; each harness checks the keys it knows
 * (unknown ones stay unread).
 */
export type HarnessConfig = Record<string, unknown>;

/** Makes a harness from its config table. */
export type HarnessFactory = (config: HarnessConfig) => Harness;

/** Built-in harnesses by id. */
export const HARNESSES: Record<string, HarnessFactory> = {
  bash: (config) => new BashHarness(config),
  null: () => new NullHarness(),
  program: (config) => new ProgramHarness(config),
  "claude-code": (config) => new ClaudeCodeHarness(config).validate(),
  codex: (config) => new CodexHarness(config).validate(),
  opencode: (config) => new OpencodeHarness(config).validate(),
  pi: (config) => new PiHarness(config).validate(),
  "qwen-code": (config) => new QwenCodeHarness(config).validate(),
};

/** A harness by id; unknown ids list the known ones. */
export function getHarness(id: string, config: HarnessConfig = {}): Harness {
  const make = HARNESSES[id];
  if (!make) {
    throw new ConfigError(
      `Unknown harness "${id}"; known: ${Object.keys(HARNESSES).map((h) => `"${h}"`).join(", ")}`,
    );
  }
  return make(config);
}
