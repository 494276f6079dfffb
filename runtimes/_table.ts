/**
 * Fields several backends' runtime tables share, one schema each, so a key means the same in
 * every table that has it, and helpers their `specOf` functions share.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "../lib/errors.ts";
import type { TaskNeeds } from "./runtime.ts";

// The tables' types are written out: they are part of the public API (a task's RuntimeConfig).
type NetworkPolicyShape = {
  allow: z.ZodOptional<z.ZodArray<z.ZodString>>;
  block: z.ZodOptional<z.ZodArray<z.ZodString>>;
};

/** `network = { allow = [...], block = [...] }`: hosts are checked when the run starts. */
export const NetworkPolicyTable: z.ZodObject<NetworkPolicyShape, z.core.$strict> = z.strictObject<
  NetworkPolicyShape
>({
  allow: z.array(z.string()).optional(),
  block: z.array(z.string()).optional(),
});

/** Fields most sandboxes take (which ones, each backend's table says). */
export const COMMON_FIELDS: {
  image: z.ZodOptional<z.ZodString>;
  cpu: z.ZodOptional<z.ZodNumber>;
  memory: z.ZodOptional<z.ZodUnion<readonly [z.ZodNumber, z.ZodString]>>;
  workdir: z.ZodOptional<z.ZodString>;
  network: z.ZodOptional<z.ZodUnion<readonly [z.ZodBoolean, typeof NetworkPolicyTable]>>;
  env: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodString>>;
} = {
  image: z.string().optional(),
  /** CPU cores. */
  cpu: z.number().positive().optional(),
  /** Memory in GB (a number) or a Docker-style string ("512m", "2g"). */
  memory: z.union([z.number().positive(), z.string()]).optional(),
  workdir: z.string().optional(),
  /** On/off, or an egress policy `{ allow = ["host:port", "*.domain"], block = [...] }`. */
  network: z.union([z.boolean(), NetworkPolicyTable]).optional(),
  env: z.record(z.string(), z.string()).optional(),
};

/** The SSH login: the ssh runtime's, and a Prime sandbox's. */
export const LOGIN_FIELDS: {
  user: z.ZodOptional<z.ZodString>;
  private_key_path: z.ZodOptional<z.ZodString>;
  known_hosts_path: z.ZodOptional<z.ZodString>;
  trust_on_first_use: z.ZodOptional<z.ZodBoolean>;
} = {
  user: z.string().optional(),
  private_key_path: z.string().optional(),
  known_hosts_path: z.string().optional(),
  trust_on_first_use: z.boolean().optional(),
};

/** The sandbox's environment: the task's, the config's over it, then the caller's extra. */
export function envOf(
  config: { env?: Record<string, string> },
  needs: TaskNeeds,
): Record<string, string> {
  return { ...(needs.env ?? {}), ...(config.env ?? {}), ...(needs.extraEnv ?? {}) };
}

/** Memory as Docker and Kubernetes take it: a number of GB becomes megabytes. */
export function memoryString(m: number | string | undefined): string | undefined {
  if (m === undefined) return undefined;
  return typeof m === "number" ? `${Math.round(m * 1024)}m` : m;
}

/** Network on or off: a policy is enforced by the egress proxy, never by an open network. */
export function networkOn(config: { network?: unknown }, needs: TaskNeeds): boolean {
  return (config.network ?? needs.network ?? false) === true;
}

/** The task's image, or the error naming where to set one. */
export function imageOf(config: { image?: string }, needs: TaskNeeds): string {
  const image = config.image ?? needs.image;
  if (!image) {
    throw new ConfigError(
      `Task "${needs.task}" has no image for its ${needs.role} sandbox; set TaskData.image or ` +
        `--env.agent.runtime.image`,
    );
  }
  return image;
}
