/**
 * Runtime configs as users write them (`[env.agent.runtime]`, `[env.agent.scoring.runtime]`):
 * one table whose keys are the backends' own, tagged by `type` (default `"docker"`); the spec
 * a task's sandbox gets from it (each backend's `specOf`), and what a runtime of a spec can do
 * before anything starts ({@linkcode traitsOf}), so callers ask traits instead of `type`.
 *
 * ```ts
 * const spec = specOf({ type: "docker", cpu: 2 }, { task: "t", role: "agent", container: true, image: "busybox" });
 * traitsOf(spec).isolation; // true
 * ```
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "../lib/errors.ts";
import { COMMON_FIELDS } from "./_table.ts";
import * as docker from "./docker/config.ts";
import * as kubernetes from "./k8s/config.ts";
import * as prime from "./prime/config.ts";
import * as ssh from "./ssh/config.ts";
import * as subprocess from "./subprocess/config.ts";
import type { RuntimeSpec, RuntimeTraits, SshRuntimeSpec, TaskNeeds } from "./runtime.ts";

export { NetworkPolicyTable } from "./_table.ts";
export type { DockerConfig } from "./docker/config.ts";
export type { KubernetesConfig } from "./k8s/config.ts";
export type { PrimeConfig } from "./prime/config.ts";
export type { SshConfig } from "./ssh/config.ts";
export type { SubprocessConfig } from "./subprocess/config.ts";

/** The runtime types there are. */
export const RUNTIME_TYPES = ["docker", "subprocess", "ssh", "prime", "kubernetes"] as const;

/** A runtime type. */
export type RuntimeType = typeof RUNTIME_TYPES[number];

/**
 * Each type's table, tagged by `type`: the keys that type uses, typed (keys for other types
 * are left out).
 */
export const RuntimeConfigByType = z.discriminatedUnion("type", [
  docker.DockerTable,
  subprocess.SubprocessTable,
  ssh.SshTable,
  prime.PrimeTable,
  kubernetes.KubernetesTable,
]);

/** One type's table. */
export type TypedRuntimeConfig = z.infer<typeof RuntimeConfigByType>;

/** {@link RuntimeTable}'s fields, written out because a task's RuntimeConfig is public API. */
type RuntimeShape =
  & {
    type: z.ZodOptional<z.ZodEnum<{ [T in RuntimeType]: T }>>;
    warm_pool: z.ZodOptional<z.ZodNumber>;
  }
  & typeof kubernetes.KUBERNETES_FIELDS
  & typeof ssh.SSH_FIELDS
  & typeof prime.PRIME_FIELDS
  & typeof COMMON_FIELDS;

/**
 * The runtime table users write: `type` (default `"docker"`) and every backend's keys, so a
 * config switched to another type by `--env.agent.runtime.type` keeps working (keys the type
 * does not use are ignored); a key no backend knows is refused by name.
 */
export const RuntimeTable: z.ZodObject<RuntimeShape, z.core.$strict> = z.strictObject<
  RuntimeShape
>({
  type: z.enum(RUNTIME_TYPES).optional(),
  ...kubernetes.KUBERNETES_FIELDS,
  ...ssh.SSH_FIELDS,
  ...prime.PRIME_FIELDS,
  ...COMMON_FIELDS,
  /** Started agent sandboxes kept ready per sandbox shape (grading sandboxes are always fresh). */
  warm_pool: z.number().int().min(0).optional(),
});

/** A runtime as configured in TOML (`[env.agent.runtime]`, `[env.agent.scoring.runtime]`). */
export interface RuntimeConfig extends z.input<typeof RuntimeTable> {}

/**
 * The spec of a task's sandbox under a runtime config: the config's fields over the task's.
 * @throws {ConfigError} for an unknown `type`, or a task the runtime cannot serve (a
 *   container task on the subprocess runtime or a shared ssh host, no image for docker)
 */
export function specOf(config: RuntimeConfig, needs: TaskNeeds): RuntimeSpec {
  const type = config.type ?? "docker";
  const typed = { ...config, type } as never;
  switch (type) {
    case "docker":
      return docker.specOf(typed, needs);
    case "subprocess":
      return subprocess.specOf(typed, needs);
    case "ssh":
      return ssh.specOf(typed, needs);
    case "prime":
      return prime.specOf(typed, needs);
    case "kubernetes":
      return kubernetes.specOf(typed, needs);
    default:
      throw new ConfigError(
        `Unknown runtime type "${type}"; known: ${RUNTIME_TYPES.map((t) => `"${t}"`).join(", ")}`,
      );
  }
}

/** What a runtime of `spec` can do, without starting it. */
export function traitsOf(spec: RuntimeSpec): RuntimeTraits {
  switch (spec.type) {
    case "docker":
      return docker.traitsOf(spec);
    case "subprocess":
      return subprocess.traitsOf();
    case "ssh":
      return ssh.traitsOf(spec);
    case "prime":
      return prime.traitsOf();
    case "kubernetes":
      return kubernetes.traitsOf();
    default:
      throw new ConfigError(
        `Unknown runtime type "${(spec as { type?: unknown }).type}"; known: ` +
          RUNTIME_TYPES.map((t) => `"${t}"`).join(", "),
      );
  }
}

/**
 * What a runtime under `config` can do as far as the config alone tells (before a task makes
 * it a spec): its type's traits, a docker container on no network of its own, an ssh host
 * dedicated when the config says so.
 * @throws {ConfigError} for an unknown `type`
 */
export function traitsOfConfig(config: { type?: string; dedicated?: boolean }): RuntimeTraits {
  const type = config.type ?? "docker";
  if (type === "docker") return docker.traitsOf({});
  if (type === "ssh") return ssh.traitsOf({ dedicated: config.dedicated });
  return traitsOf({ type } as RuntimeSpec);
}

/** The dedicated host a spec names, or undefined when it names none. */
export function dedicatedHostOf(spec: RuntimeSpec): string | undefined {
  return traitsOf(spec).dedicated ? (spec as SshRuntimeSpec).host : undefined;
}
