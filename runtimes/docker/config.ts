/**
 * The docker runtime's table (`[env.agent.runtime]` with `type = "docker"`, the default), the
 * spec a task's sandbox gets from it, and what a container can do.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { COMMON_FIELDS, envOf, imageOf, memoryString, networkOn } from "../_table.ts";
import type { DockerRuntimeSpec, RuntimeTraits, TaskNeeds } from "../runtime.ts";

/** The keys a docker table uses; others in `[env.agent.runtime]` are for other types. */
export const DockerTable = z.object({
  type: z.literal("docker"),
  image: COMMON_FIELDS.image,
  cpu: COMMON_FIELDS.cpu,
  memory: COMMON_FIELDS.memory,
  workdir: COMMON_FIELDS.workdir,
  network: COMMON_FIELDS.network,
  env: COMMON_FIELDS.env,
});

/** A docker runtime table. */
export type DockerConfig = z.infer<typeof DockerTable>;

/**
 * A container of the task's image (or the table's), sized by the table or the task.
 * @throws {ConfigError} when neither names an image
 */
export function specOf(config: DockerConfig, needs: TaskNeeds): DockerRuntimeSpec {
  return {
    type: "docker",
    image: imageOf(config, needs),
    cpu: config.cpu ?? needs.resources?.cpu,
    memory: memoryString(config.memory ?? needs.resources?.memory),
    workdir: config.workdir ?? needs.workdir,
    env: envOf(config, needs),
    network: networkOn(config, needs),
    labels: { "vf.role": needs.role },
  };
}

/** A container: isolated, with users, networks of its own and snapshots. */
export function traitsOf(spec: Pick<DockerRuntimeSpec, "command" | "networkName">): RuntimeTraits {
  return {
    isolation: true,
    users: "always",
    networkControl: true,
    // A container running its own command has processes a sweep cannot tell apart.
    killProcesses: spec.command === undefined,
    snapshots: true,
    ownNetwork: true,
    enclosed: Boolean(spec.networkName),
    egress: true,
    services: true,
    gateway: "network",
    artifacts: true,
    imageBuilds: true,
    onHost: false,
    dedicated: false,
    label: "docker runtime",
  };
}
