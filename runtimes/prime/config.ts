/**
 * The prime runtime's table (`type = "prime"`), the spec a task's sandbox gets from it, and
 * what a Prime Intellect sandbox can do.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { COMMON_FIELDS, envOf, LOGIN_FIELDS } from "../_table.ts";
import type { PrimeRuntimeSpec, RuntimeTraits, TaskNeeds } from "../runtime.ts";

/** The keys only prime tables use, in the order `[env.agent.runtime]` lists them. */
export const PRIME_FIELDS: {
  gpu: z.ZodOptional<z.ZodString>;
  disk: z.ZodOptional<z.ZodNumber>;
  ttl_minutes: z.ZodOptional<z.ZodNumber>;
  api_base: z.ZodOptional<z.ZodString>;
  api_key_var: z.ZodOptional<z.ZodString>;
} = {
  /** GPU type/count, disk GB, provider-side time-to-live, API base and key variable. */
  gpu: z.string().optional(),
  disk: z.number().positive().optional(),
  ttl_minutes: z.number().int().positive().optional(),
  api_base: z.string().optional(),
  api_key_var: z.string().optional(),
};

/** The keys a prime table uses; others in `[env.agent.runtime]` are for other types. */
export const PrimeTable = z.object({
  type: z.literal("prime"),
  ...PRIME_FIELDS,
  ...LOGIN_FIELDS,
  image: COMMON_FIELDS.image,
  cpu: COMMON_FIELDS.cpu,
  memory: COMMON_FIELDS.memory,
  workdir: COMMON_FIELDS.workdir,
  env: COMMON_FIELDS.env,
});

/** A prime runtime table. */
export type PrimeConfig = z.infer<typeof PrimeTable>;

/** A Prime sandbox of the task's image (or the table's); memory only as a number of GB. */
export function specOf(config: PrimeConfig, needs: TaskNeeds): PrimeRuntimeSpec {
  const memory = config.memory ?? needs.resources?.memory;
  return {
    type: "prime",
    image: config.image ?? needs.image,
    gpu: config.gpu,
    cpu: config.cpu ?? needs.resources?.cpu,
    memory: typeof memory === "number" ? memory : undefined,
    disk: config.disk,
    ttlMinutes: config.ttl_minutes,
    apiBase: config.api_base,
    apiKeyVar: config.api_key_var,
    workdir: config.workdir ?? needs.workdir,
    env: envOf(config, needs),
    labels: { "vf.role": needs.role },
    ssh: {
      user: config.user,
      privateKeyPath: config.private_key_path,
      knownHostsPath: config.known_hosts_path,
      trustOnFirstUse: config.trust_on_first_use,
    },
  };
}

/** A sandbox of its own, reached over SSH: users when its login may switch them. */
export function traitsOf(): RuntimeTraits {
  return {
    isolation: true,
    users: "if-privileged",
    networkControl: false,
    killProcesses: false,
    snapshots: false,
    ownNetwork: false,
    enclosed: false,
    egress: false,
    services: false,
    gateway: null,
    artifacts: true,
    onHost: false,
    dedicated: false,
    label: "prime runtime",
  };
}
