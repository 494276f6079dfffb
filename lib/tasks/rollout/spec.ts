/**
 * The sandboxes a rollout asks for: a runtime spec from the run's runtime config and the
 * task's needs, the egress policy around it, and the checks the agent's spec must pass before
 * anything starts.
 * @module
 */
import type { RuntimeSpec } from "../../../runtimes/runtime.ts";
import { ConfigError } from "../../errors.ts";
import {
  CLOSED_POLICY,
  composePolicies,
  type NetworkPolicy,
  parseNetworkPolicy,
} from "../../gateway/policy.ts";
import type { RuntimeConfig, Task } from "../task.ts";
import type { RolloutState } from "./state.ts";
import { warnOnce } from "./_warn.ts";

function memoryString(m: number | string | undefined): string | undefined {
  if (m === undefined) return undefined;
  return typeof m === "number" ? `${Math.round(m * 1024)}m` : m;
}

/** Build a runtime spec from a runtime config plus the task's requirements. */
export function resolveRuntimeSpec(
  config: RuntimeConfig,
  task: Task,
  role: "agent" | "grader",
  extraEnv: Record<string, string> = {},
): RuntimeSpec {
  const data = task.data;
  const type = config.type ?? "docker";
  const env = { ...task.runtimeEnv(), ...(config.env ?? {}), ...extraEnv };
  if (type === "subprocess") {
    if (task.needsContainer) {
      throw new ConfigError(
        `Task "${task.key}" needs a container runtime${
          data.image ? ` (image "${data.image}")` : ""
        }; the subprocess runtime cannot run it; use --env.agent.runtime.type docker`,
      );
    }
    return { type: "subprocess", workdir: config.workdir ?? data.workdir, env };
  }
  if (type === "ssh") {
    if (!config.host) {
      throw new ConfigError(`The ssh runtime needs a host: --env.agent.runtime.host <host>`);
    }
    if (task.needsContainer && !config.dedicated) {
      throw new ConfigError(
        `Task "${task.key}" needs a container; a shared SSH host is not one. Use docker or prime, ` +
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
      workdir: config.workdir ?? data.workdir,
      env,
    };
  }
  if (type === "prime") {
    const memory = config.memory ?? data.resources?.memory;
    return {
      type: "prime",
      image: config.image ?? data.image,
      gpu: config.gpu,
      cpu: config.cpu ?? data.resources?.cpu,
      memory: typeof memory === "number" ? memory : undefined,
      disk: config.disk,
      ttlMinutes: config.ttl_minutes,
      apiBase: config.api_base,
      apiKeyVar: config.api_key_var,
      workdir: config.workdir ?? data.workdir,
      env,
      labels: { "vf.role": role },
      ssh: {
        user: config.user,
        privateKeyPath: config.private_key_path,
        knownHostsPath: config.known_hosts_path,
        trustOnFirstUse: config.trust_on_first_use,
      },
    };
  }
  if (type !== "docker" && type !== "kubernetes") {
    throw new ConfigError(
      `Unknown runtime type "${type}"; known: "docker", "subprocess", "ssh", "prime", "kubernetes"`,
    );
  }
  const image = config.image ?? data.image;
  if (!image) {
    throw new ConfigError(
      `Task "${task.key}" has no image for its ${role} sandbox; set TaskData.image or ` +
        `--env.agent.runtime.image`,
    );
  }
  if (type === "kubernetes") {
    return {
      type: "kubernetes",
      image,
      kubeconfig: config.kubeconfig,
      context: config.context,
      inCluster: config.in_cluster,
      namespace: config.namespace,
      nodeSelector: config.node_selector,
      tolerations: config.tolerations,
      runtimeClassName: config.runtime_class_name,
      serviceAccountName: config.service_account_name,
      imagePullPolicy: config.image_pull_policy,
      startTimeoutMs: config.start_timeout === undefined ? undefined : config.start_timeout * 1000,
      cpu: config.cpu ?? data.resources?.cpu,
      memory: memoryString(config.memory ?? data.resources?.memory),
      workdir: config.workdir ?? data.workdir,
      env,
      network: (config.network ?? data.network ?? false) === true,
      labels: { "vf.role": role },
    };
  }
  return {
    type: "docker",
    image,
    cpu: config.cpu ?? data.resources?.cpu,
    memory: memoryString(config.memory ?? data.resources?.memory),
    workdir: config.workdir ?? data.workdir,
    env,
    // A policy is enforced by the rollout's egress proxy, never by an open bridge.
    network: (config.network ?? data.network ?? false) === true,
    labels: { "vf.role": role },
  };
}

/**
 * The egress policy of a sandbox: the runtime's and the task's composed (a task allow of `*`
 * keeps the runtime's list, two lists intersect, blocks add up); null when neither gives a
 * policy (then `network` is plain on/off). A runtime's explicit `network = false` closes it.
 * @throws {ConfigError} naming the key of an entry that is not a host
 */
export function resolveNetworkPolicy(
  config: RuntimeConfig,
  task: Task,
  where = "env.agent.runtime",
): NetworkPolicy | null {
  const r = config.network;
  const t = task.data.network;
  const rp = typeof r === "object" && r !== null ? parseNetworkPolicy(r, `${where}.network`) : null;
  const tp = typeof t === "object" && t !== null
    ? parseNetworkPolicy(t, `task "${task.key}" network`)
    : null;
  if (!rp && !tp) return null;
  if (r === false) return structuredClone(CLOSED_POLICY);
  if (rp && tp) return composePolicies(rp, tp);
  return rp ?? tp;
}

/**
 * The agent sandbox's spec (the borrowed box's, or built from the policy), once it is known to
 * suit the rollout; its egress policy goes on the rollout's state as soon as it is known.
 * @throws {ConfigError} when the runtime cannot give what the task, the harness or the scoring
 * mode needs
 */
export function agentSpecOf(s: RolloutState): RuntimeSpec {
  const { task, policy, box } = s.options;
  const spec = box ? box.spec : resolveRuntimeSpec(policy.runtime, task, "agent");
  if (s.mode === "isolated" && spec.type === "subprocess") {
    throw new ConfigError(
      `Isolated scoring needs a container runtime; the subprocess runtime cannot collect artifacts ` +
        `or start a grading sandbox (task "${task.key}"); use docker or --env.agent.scoring.mode shared`,
    );
  }
  if (policy.harness.executesCode && spec.type === "subprocess") {
    warnOnce(
      `Harness "${policy.harness.id}" runs agent commands on the host (subprocess runtime)`,
    );
  }
  const egress = s.egress = resolveNetworkPolicy(policy.runtime, task);
  if (egress && spec.type !== "docker") {
    throw new ConfigError(
      `A network policy (allow/block) is enforced on the docker runtime only; the ` +
        `${spec.type} runtime cannot (task "${task.key}")`,
    );
  }
  if (policy.harness.needsGateway && spec.type !== "docker" && spec.type !== "subprocess") {
    throw new ConfigError(
      `Harness "${policy.harness.id}" runs the agent inside the sandbox, which reaches the ` +
        `model gateway on docker and subprocess runtimes only, not ${spec.type}`,
    );
  }
  if (box && (egress || policy.harness.needsGateway)) {
    throw new ConfigError(
      `Task "${task.key}" needs a network of its own (a gateway or a network policy), which ` +
        `a borrowed sandbox does not have; run it in its own sandbox`,
    );
  }
  return spec;
}
