/**
 * The built-in harnesses by id (`--env.<role>.harness.id`).
 * @module
 */
import { ConfigError } from "../errors.ts";
import { BashHarness, type Harness, NullHarness } from "./harness.ts";
import { ProgramHarness, type ProgramHarnessOptions } from "./program.ts";

/** Built-in harnesses by id. */
export const HARNESSES: Record<string, (config: Record<string, unknown>) => Harness> = {
  bash: (config) => new BashHarness({ edit: config.edit as boolean | undefined }),
  null: () => new NullHarness(),
  program: (config) => new ProgramHarness(config as ProgramHarnessOptions),
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
