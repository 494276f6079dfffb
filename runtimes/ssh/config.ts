/**
 * The ssh runtime's table (`type = "ssh"`), the spec a task's sandbox gets from it, and what a
 * host over SSH can do: a shared host isolates nothing, a dedicated one (a VM made for the
 * run) is a sandbox of its own that serves one sandbox at a time.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "../../lib/errors.ts";
import { COMMON_FIELDS, envOf, LOGIN_FIELDS } from "../_table.ts";
import type { RuntimeTraits, SshRuntimeSpec, TaskNeeds } from "../runtime.ts";

/** The keys only ssh tables use, in the order `[env.agent.runtime]` lists them. */
export const SSH_FIELDS: {
  host: z.ZodOptional<z.ZodString>;
  port: z.ZodOptional<z.ZodNumber>;
  user: typeof LOGIN_FIELDS.user;
  private_key_path: typeof LOGIN_FIELDS.private_key_path;
  known_hosts_path: typeof LOGIN_FIELDS.known_hosts_path;
  ssh_config_path: z.ZodOptional<z.ZodString>;
  trust_on_first_use: typeof LOGIN_FIELDS.trust_on_first_use;
  dedicated: z.ZodOptional<z.ZodBoolean>;
  max_sessions: z.ZodOptional<z.ZodNumber>;
} = {
  /** The host, port, login user and credentials. */
  host: z.string().optional(),
  port: z.number().int().positive().optional(),
  user: LOGIN_FIELDS.user,
  private_key_path: LOGIN_FIELDS.private_key_path,
  known_hosts_path: LOGIN_FIELDS.known_hosts_path,
  /** OpenSSH client config read for `host` (default ~/.ssh/config; "" reads none). */
  ssh_config_path: z.string().optional(),
  trust_on_first_use: LOGIN_FIELDS.trust_on_first_use,
  /** The host is dedicated to this run (a VM), so it may serve as an isolated sandbox. */
  dedicated: z.boolean().optional(),
  /** Channels per connection the host allows (sshd's MaxSessions; default 10). */
  max_sessions: z.number().int().min(3).optional(),
};

/** The keys an ssh table uses; others in `[env.agent.runtime]` are for other types. */
export const SshTable = z.object({
  type: z.literal("ssh"),
  ...SSH_FIELDS,
  workdir: COMMON_FIELDS.workdir,
  env: COMMON_FIELDS.env,
});

/** An ssh runtime table. */
export type SshConfig = z.infer<typeof SshTable>;

/**
 * The table's host; a task that needs a container gets only a dedicated one.
 * @throws {ConfigError} without a host, or for such a task on a shared host
 */
export function specOf(config: SshConfig, needs: TaskNeeds): SshRuntimeSpec {
  if (!config.host) {
    throw new ConfigError(`The ssh runtime needs a host: --env.agent.runtime.host <host>`);
  }
  if (needs.container && !config.dedicated) {
    throw new ConfigError(
      `Task "${needs.task}" needs a container; a shared SSH host is not one. Use docker or prime, ` +
        `or mark a host used only by this run with --env.agent.runtime.dedicated true`,
    );
  }
  return {
    type: "ssh",
    host: config.host,
    port: config.port,
    user: config.user,
    privateKeyPath: config.private_key_path,
    knownHostsPath: config.known_hosts_path,
    sshConfigPath: config.ssh_config_path === "" ? null : config.ssh_config_path,
    trustOnFirstUse: config.trust_on_first_use,
    dedicated: config.dedicated,
    maxSessions: config.max_sessions,
    workdir: config.workdir ?? needs.workdir,
    env: envOf(config, needs),
  };
}

/** A host: isolated only when dedicated; users when the login may switch them. */
export function traitsOf(spec: Pick<SshRuntimeSpec, "dedicated">): RuntimeTraits {
  const dedicated = spec.dedicated === true;
  return {
    isolation: dedicated,
    users: "if-privileged",
    networkControl: false,
    // A dedicated host's processes of the sandbox are swept (by their VF_SANDBOX_ID).
    killProcesses: dedicated,
    snapshots: false,
    ownNetwork: false,
    enclosed: false,
    egress: false,
    services: false,
    gateway: null,
    artifacts: true,
    onHost: false,
    dedicated,
    label: `ssh runtime on a ${dedicated ? "dedicated" : "shared"} host`,
  };
}
