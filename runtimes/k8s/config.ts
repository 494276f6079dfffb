/**
 * The kubernetes runtime's table (`type = "kubernetes"`), the spec a task's sandbox gets from
 * it, and what a pod can do.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { COMMON_FIELDS, envOf, imageOf, memoryString, networkOn } from "../_table.ts";
import type { KubernetesRuntimeSpec, RuntimeTraits, TaskNeeds } from "../runtime.ts";

/** The keys only kubernetes tables use, in the order `[env.agent.runtime]` lists them. */
export const KUBERNETES_FIELDS: {
  kubeconfig: z.ZodOptional<z.ZodString>;
  context: z.ZodOptional<z.ZodString>;
  in_cluster: z.ZodOptional<z.ZodBoolean>;
  namespace: z.ZodOptional<z.ZodString>;
  node_selector: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodString>>;
  tolerations: z.ZodOptional<z.ZodArray<z.ZodRecord<z.ZodString, z.ZodUnknown>>>;
  runtime_class_name: z.ZodOptional<z.ZodString>;
  service_account_name: z.ZodOptional<z.ZodString>;
  image_pull_policy: z.ZodOptional<
    z.ZodEnum<{ Always: "Always"; IfNotPresent: "IfNotPresent"; Never: "Never" }>
  >;
  start_timeout: z.ZodOptional<z.ZodNumber>;
} = {
  /** kubeconfig and context (default $KUBECONFIG or ~/.kube/config, its current context), or the pod's service account. */
  kubeconfig: z.string().optional(),
  context: z.string().optional(),
  in_cluster: z.boolean().optional(),
  /** Namespace (default the context's), scheduling and sandboxing of the pods. */
  namespace: z.string().optional(),
  node_selector: z.record(z.string(), z.string()).optional(),
  tolerations: z.array(z.record(z.string(), z.unknown())).optional(),
  runtime_class_name: z.string().optional(),
  service_account_name: z.string().optional(),
  image_pull_policy: z.enum(["Always", "IfNotPresent", "Never"]).optional(),
  /** Seconds a pod may take to start running (default 300). */
  start_timeout: z.number().positive().optional(),
};

/** The keys a kubernetes table uses; others in `[env.agent.runtime]` are for other types. */
export const KubernetesTable = z.object({
  type: z.literal("kubernetes"),
  ...KUBERNETES_FIELDS,
  image: COMMON_FIELDS.image,
  cpu: COMMON_FIELDS.cpu,
  memory: COMMON_FIELDS.memory,
  workdir: COMMON_FIELDS.workdir,
  network: COMMON_FIELDS.network,
  env: COMMON_FIELDS.env,
});

/** A kubernetes runtime table. */
export type KubernetesConfig = z.infer<typeof KubernetesTable>;

/**
 * A pod of the task's image (or the table's), scheduled and sized as the table says.
 * @throws {ConfigError} when neither names an image
 */
export function specOf(config: KubernetesConfig, needs: TaskNeeds): KubernetesRuntimeSpec {
  return {
    type: "kubernetes",
    image: imageOf(config, needs),
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
    cpu: config.cpu ?? needs.resources?.cpu,
    memory: memoryString(config.memory ?? needs.resources?.memory),
    workdir: config.workdir ?? needs.workdir,
    env: envOf(config, needs),
    network: networkOn(config, needs),
    labels: { "vf.role": needs.role },
  };
}

/** A pod: isolated, network off by a NetworkPolicy; users when its user may switch them. */
export function traitsOf(): RuntimeTraits {
  return {
    isolation: true,
    users: "if-privileged",
    networkControl: true,
    killProcesses: true,
    snapshots: false,
    ownNetwork: false,
    enclosed: false,
    egress: false,
    services: false,
    gateway: null,
    artifacts: true,
    onHost: false,
    dedicated: false,
    label: "kubernetes runtime",
  };
}
