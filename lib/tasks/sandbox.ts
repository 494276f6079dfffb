/**
 * The one way a task gets a sandbox: from the run's sandbox source (a warm pool, the run's
 * limits; its runtimes enter the ledger as they start), else created and started here, and
 * recorded for `vf replay` when the caller keeps records.
 *
 * ```ts
 * const runtime = await acquireSandbox(spec, { runId, task: task.key, role: "agent" });
 * try {
 *   await runtime.run(["true"]);
 * } finally {
 *   await runtime.stop();
 * }
 * ```
 * @module
 */
import { createRuntime } from "../../runtimes/create.ts";
import type { AcquireOptions, SandboxSource } from "../../runtimes/pool.ts";
import type { Runtime, RuntimeSpec } from "../../runtimes/runtime.ts";
import { traitsOf } from "../../runtimes/config.ts";
import { recordingRuntime, type SandboxRecord } from "./record.ts";

/** Options of {@link acquireSandbox}. */
export interface AcquireSandboxOptions extends AcquireOptions {
  /** Where sandboxes come from (limits, a warm pool); default: created and started here. */
  sandboxes?: SandboxSource;
  /** Where the sandbox's operations are recorded (for `vf replay`); default: not recorded. */
  records?: SandboxRecord[];
  /**
   * Gets the sandbox as soon as the caller may use it, before it is started when it is made
   * here, so a caller whose phase is cut short meanwhile can stop it; default: none.
   */
  hold?: (runtime: Runtime) => void;
}

/**
 * A started sandbox for `spec`, which the caller stops. A sandbox that fails to start is
 * stopped here; one that arrives after `signal` aborted is stopped here and the abort's
 * reason thrown. The live `slot` (taken with what surrounds the sandbox) is the sandbox's:
 * it is released whenever the sandbox does not start on it.
 * @throws {SandboxError} when the sandbox cannot be created or started
 */
export async function acquireSandbox(
  spec: RuntimeSpec,
  options: AcquireSandboxOptions,
): Promise<Runtime> {
  const { sandboxes, records, hold, slot, onQueue, signal } = options;
  const role = options.role ?? "agent";
  const labels = { runId: options.runId, task: options.task };
  // Every operation on it is recorded, for vf replay.
  const recorded = (runtime: Runtime) => {
    if (!records) return runtime;
    const record: SandboxRecord = {
      role,
      type: runtime.type,
      capabilities: runtime.capabilities,
      ops: [],
    };
    records.push(record);
    const wrapped = recordingRuntime(runtime, record);
    hold?.(wrapped);
    return wrapped;
  };
  if (!sandboxes) {
    slot?.release();
    const runtime = createRuntime(spec, labels);
    hold?.(runtime);
    try {
      await runtime.start({ signal, onQueue });
    } catch (error) {
      await runtime.stop().catch(() => {});
      throw error;
    }
    return recorded(runtime);
  }
  // A sandbox on a rollout's own network is made for it, never pooled; it starts on the slot
  // taken with its enclosure's, so it counts against [limits] with its services.
  const ownNetwork = traitsOf(spec).enclosed;
  let runtime: Runtime;
  try {
    runtime = await sandboxes.acquire(spec, {
      ...labels,
      role,
      ...(options.rollout !== undefined ? { rollout: options.rollout } : {}),
      ...(options.unpooled ? { unpooled: true } : {}),
      ...(ownNetwork ? { unpooled: true, slot } : {}),
      ...(slot || !onQueue ? {} : { onQueue }),
      signal,
    });
  } catch (error) {
    // Never handed to a sandbox (refused at once), or its sandbox is already removed.
    slot?.release();
    throw error;
  }
  if (signal?.aborted) {
    // The caller's phase is over (timeout, interrupt): nobody will use or stop this one.
    await runtime.stop().catch(() => {});
    throw signal.reason;
  }
  hold?.(runtime);
  return recorded(runtime);
}
