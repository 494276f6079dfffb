/**
 * The sandboxes a rollout asks for: a runtime spec from the run's runtime config and the
 * task's needs, the egress policy around it, and the checks the agent's spec must pass before
 * anything starts.
 * @module
 */
import { specOf, traitsOf, traitsOfConfig } from "../../../runtimes/config.ts";
import type { RuntimeSpec } from "../../../runtimes/runtime.ts";
import { ConfigError } from "../../errors.ts";
import {
  CLOSED_POLICY,
  composePolicies,
  type NetworkPolicy,
  OPEN_POLICY,
  parseNetworkPolicy,
} from "../../gateway/policy.ts";
import type { RuntimeConfig, Task } from "../task.ts";
import type { RolloutState } from "./state.ts";
import { warnOnce } from "./_warn.ts";

/** Build a runtime spec from a runtime config plus the task's requirements. */
export function resolveRuntimeSpec(
  config: RuntimeConfig,
  task: Task,
  role: "agent" | "grader",
  extraEnv: Record<string, string> = {},
): RuntimeSpec {
  const data = task.data;
  return specOf(config, {
    task: task.key,
    role,
    container: task.needsContainer,
    image: data.image,
    workdir: data.workdir,
    resources: data.resources,
    network: data.network,
    env: task.runtimeEnv(),
    extraEnv,
  });
}

/**
 * The egress policy of a sandbox: the runtime's and the task's composed (a task allow of `*`
 * keeps the runtime's list, two lists intersect, blocks add up); null when neither gives a
 * policy (then `network` is plain on/off). A runtime's explicit `network = false` closes it.
 * On a runtime with the egress proxy, plain `network = true` is the open policy (allow `*`):
 * the internet through the proxy, which refuses the evaluator's own host and other rollouts'
 * containers, never a bridge the host is on.
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
  if (!rp && !tp) {
    const on = r === true || (r === undefined && t === true);
    return on && traitsOfConfig(config).egress ? structuredClone(OPEN_POLICY) : null;
  }
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
  const traits = traitsOf(spec);
  if (s.mode === "isolated" && !traits.artifacts) {
    throw new ConfigError(
      `Isolated scoring needs a container runtime; the subprocess runtime cannot collect artifacts ` +
        `or start a grading sandbox (task "${task.key}"); use docker or --env.agent.scoring.mode shared`,
    );
  }
  if (policy.harness.executesCode && traits.onHost) {
    warnOnce(
      `Harness "${policy.harness.id}" runs agent commands on the host (subprocess runtime)`,
    );
  }
  const egress = s.egress = resolveNetworkPolicy(policy.runtime, task);
  if (egress && !traits.egress) {
    throw new ConfigError(
      `A network policy (allow/block) is enforced on the docker runtime only; the ` +
        `${spec.type} runtime cannot (task "${task.key}")`,
    );
  }
  if (policy.harness.needsGateway && traits.gateway === null) {
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
