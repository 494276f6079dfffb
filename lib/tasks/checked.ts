/**
 * The sandboxes `vf validate` starts, for its checks and its integrity probes: a task's
 * sandbox with what a rollout's has around it (the task's Compose services and network
 * policy), through the run's sandbox source when there is one (its limits count them).
 * @module
 */
import type { SandboxSlot } from "../../runtimes/limits.ts";
import type { SandboxSource } from "../../runtimes/pool.ts";
import type { Runtime, RuntimeSpec } from "../../runtimes/runtime.ts";
import type { NetworkPolicy } from "../gateway/policy.ts";
import type { ServicesSpec } from "../services/compose.ts";
import { ComposeCache, type LoadedServices } from "../services/cache.ts";
import { Enclosure } from "./enclosure.ts";
import { acquireSandbox } from "./sandbox.ts";
import type { Task } from "./task.ts";

const SERVICES = new WeakMap<Task, Promise<LoadedServices | null>>();

/**
 * The task's Compose services (null: none), asked of the task once however many checks and
 * probes start sandboxes for it, and parsed through the run's `cache`, so the tasks of a run
 * that name one Compose file share one parse; a file that cannot be read rejects each of them
 * alike. Without a cache the task's spec is parsed for it alone.
 */
export function servicesOf(
  task: Task,
  cache: ComposeCache = new ComposeCache(),
): Promise<LoadedServices | null> {
  let services = SERVICES.get(task);
  if (!services) {
    const compose = task.deploymentSpec();
    services = compose === null ? Promise.resolve(null) : cache.load(compose);
    SERVICES.set(task, services);
  }
  return services;
}

/** A started sandbox and what surrounds it; disposing of it removes both. */
export interface CheckedSandbox extends AsyncDisposable {
  readonly runtime: Runtime;
  /**
   * Puts the network policy's phase in force: `agent` once setup is done, `grade` for the
   * rewards (setup, restores and staging run unrestricted, as in a run). No policy: nothing.
   */
  phase(name: "agent" | "grade"): void;
}

/** Options of {@link startChecked}. */
export interface CheckedOptions {
  runId: string;
  role: "agent" | "grader";
  /** Services started fresh beside it, as in a run (null: none). */
  services: ServicesSpec | null;
  /** Its network policy (null: the network as the runtime has it). */
  egress: NetworkPolicy | null;
  /** Where it comes from (limits); default: created and started here. */
  sandboxes?: SandboxSource;
  signal?: AbortSignal;
}

/** Starts a sandbox of `spec` for `task` inside its services and network policy. */
export async function startChecked(
  task: Task,
  spec: RuntimeSpec,
  options: CheckedOptions,
): Promise<CheckedSandbox> {
  const { egress, sandboxes, signal } = options;
  const needs = {
    runId: options.runId,
    task: task.key,
    model: "validate",
    services: options.services,
    gateway: false,
    egress: egress !== null,
    alias: options.role,
    signal: signal ?? new AbortController().signal,
  };
  let enclosure: Enclosure | null = null;
  let slot: SandboxSlot | undefined;
  if (Enclosure.needed(needs)) {
    const opened = await Enclosure.open(spec, needs, sandboxes);
    enclosure = opened.enclosure;
    spec = opened.spec;
    slot = opened.slot;
  }
  let runtime: Runtime;
  try {
    runtime = await acquireSandbox(spec, {
      runId: options.runId,
      task: task.key,
      role: options.role,
      sandboxes,
      slot,
      signal,
    });
  } catch (error) {
    await enclosure?.close();
    throw error;
  }
  const session = enclosure?.route?.session;
  return {
    runtime,
    phase(name) {
      if (egress) session?.setPhase(name, egress);
    },
    async [Symbol.asyncDispose]() {
      try {
        await runtime.stop();
      } finally {
        // An enclosure's network goes only once its sandboxes have.
        await enclosure?.close();
      }
    },
  };
}
