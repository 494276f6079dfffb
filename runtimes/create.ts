/**
 * {@linkcode createRuntime}: builds a runtime of any built-in type from its spec. The
 * backends are imported statically, so a compiled binary embeds them all.
 * @module
 */

import { ConfigError } from "../lib/errors.ts";
import { RUNTIME_TYPES } from "./config.ts";
import { DockerRuntime } from "./docker/mod.ts";
import { KubernetesRuntime } from "./k8s/mod.ts";
import { PrimeRuntime } from "./prime/runtime.ts";
import type { Runtime, RuntimeSpec } from "./runtime.ts";
import { SshRuntime } from "./ssh/runtime.ts";
import { SubprocessRuntime } from "./subprocess.ts";

export { RUNTIME_TYPES };

/**
 * Builds a runtime (not started) from its spec.
 * @param spec the runtime spec
 * @param options.runId run id, put on container labels
 * @param options.task task name or id, put on container labels
 * @throws {ConfigError} for an unknown `type`
 */
export function createRuntime(
  spec: RuntimeSpec,
  options: { runId?: string; task?: string } = {},
): Runtime {
  switch (spec.type) {
    case "docker":
      return new DockerRuntime(spec, options);
    case "subprocess":
      return new SubprocessRuntime(spec, options);
    case "ssh":
      return new SshRuntime(spec, options);
    case "prime":
      return new PrimeRuntime(spec, options);
    case "kubernetes":
      return new KubernetesRuntime(spec, options);
    default: {
      const type = (spec as { type?: unknown }).type;
      throw new ConfigError(
        `Unknown runtime type "${String(type)}"; known types: ` +
          RUNTIME_TYPES.map((t) => `"${t}"`).join(", "),
      );
    }
  }
}
