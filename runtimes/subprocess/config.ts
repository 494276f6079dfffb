/**
 * The subprocess runtime's table (`type = "subprocess"`), the spec a task's sandbox gets from
 * it, and what a temp dir on the host can do.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "../../lib/errors.ts";
import { COMMON_FIELDS, envOf } from "../_table.ts";
import type { RuntimeTraits, SubprocessRuntimeSpec, TaskNeeds } from "../runtime.ts";

/** The keys a subprocess table uses; others in `[env.agent.runtime]` are for other types. */
export const SubprocessTable = z.object({
  type: z.literal("subprocess"),
  workdir: COMMON_FIELDS.workdir,
  env: COMMON_FIELDS.env,
});

/** A subprocess runtime table. */
export type SubprocessConfig = z.infer<typeof SubprocessTable>;

/**
 * A temp dir on the host, for a task that needs no container.
 * @throws {ConfigError} when the task needs one
 */
export function specOf(config: SubprocessConfig, needs: TaskNeeds): SubprocessRuntimeSpec {
  if (needs.container) {
    throw new ConfigError(
      `Task "${needs.task}" needs a container runtime${
        needs.image ? ` (image "${needs.image}")` : ""
      }; the subprocess runtime cannot run it; use --env.agent.runtime.type docker`,
    );
  }
  return {
    type: "subprocess",
    workdir: config.workdir ?? needs.workdir,
    env: envOf(config, needs),
  };
}

/** Host processes: nothing isolated; the model gateway is on loopback. */
export function traitsOf(): RuntimeTraits {
  return {
    isolation: false,
    users: "never",
    networkControl: false,
    killProcesses: false,
    snapshots: false,
    ownNetwork: false,
    enclosed: false,
    egress: false,
    services: false,
    gateway: "loopback",
    artifacts: false,
    onHost: true,
    dedicated: false,
    label: "subprocess runtime",
  };
}
