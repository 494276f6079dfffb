/**
 * A rollout's opening: the agent's sandbox (borrowed, or started inside its enclosure, with
 * fresh sandboxes tried after infrastructure failures), the task's setup or a fork group's
 * snapshot in its place, and the rollout's toolsets.
 * @module
 */
import {
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxImageError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "../../../runtimes/errors.ts";
import { traitsOf } from "../../../runtimes/config.ts";
import type { RuntimeSpec } from "../../../runtimes/runtime.ts";
import { ConfigError, SandboxError, TaskError } from "../../errors.ts";
import { Toolbox, type ToolboxRecord } from "../../tools/toolbox.ts";
import { awaitSeed, type ForkLead, type ForkSeed } from "../fork.ts";
import { acquireSandbox } from "../sandbox.ts";
import { grantAgentUser } from "./artifacts.ts";
import { phase } from "./phase.ts";
import type { RolloutState } from "./state.ts";
import { warnOnce } from "./_warn.ts";

/** Sandbox failures worth a fresh sandbox: it could not be created, reached or made ready. */
function isSandboxInfra(error: unknown): boolean {
  return error instanceof SandboxError && !(
    error instanceof SandboxFileNotFoundError || error instanceof SandboxFileTooLargeError ||
    error instanceof SandboxImageError || error instanceof SandboxUnsupportedError
  );
}

/**
 * Start (or borrow) the agent's sandbox and set it up: the task's setup, or, for a fork
 * group's member, the leader's snapshot. A sandbox that fails for infrastructure is replaced
 * by a fresh one (`policy.infraRetries`), after a backoff.
 */
export async function setUpAgent(s: RolloutState): Promise<void> {
  const { task, policy, signal, box } = s.options;
  const timing = s.trace.timing;
  const retries = box ? 0 : policy.infraRetries ?? 2;
  const fork = box ? null : s.options.forks?.join(
    `${s.options.role ?? "agent"}\0${task.key}`,
  ) ?? null;
  if (fork?.lead) s.leading = fork;
  let seed: ForkSeed | null = null;
  // A member waits for its leader's setup and snapshot outside its own setup timeout
  // (counted in it, a slow leader made every member time out and set up anyway). The
  // leader's first attempt bounds the wait: it settles the group however that ends.
  if (fork && !fork.lead) seed = await (signal ? awaitSeed(fork, signal) : fork.seed);
  if (!box && !seed) await bakeAgentImage(s);
  for (let attempt = 0;; attempt++) {
    if (attempt > 0) s.trace.runtime.attempts = attempt + 1;
    let ready = false;
    try {
      await phase("setup", async (cut, queued) => {
        const t1 = performance.now();
        if (box) {
          if (s.compose !== null) {
            throw new ConfigError(
              `Task "${task.key}" has services, which a borrowed sandbox does not bring; ` +
                `run it in its own sandbox`,
            );
          }
          s.agent = box.runtime;
        } else {
          const own = s.agentSpec!;
          // Waiting for a sandbox slot under [limits] is not setup taking too long.
          const spec = await s.prepareNetwork(
            seed ? { ...own, image: seed.image } as RuntimeSpec : own,
            { signal: cut, onQueue: queued },
          );
          const slot = s.agentSlot;
          s.agentSlot = undefined;
          await acquireSandbox(spec, {
            runId: s.options.runId,
            task: task.key,
            role: "agent",
            rollout: s.options.rolloutIndex ?? 0,
            // A snapshot's sandbox is of a one-off shape: never from or into a pool.
            unpooled: seed !== null,
            sandboxes: policy.sandboxes,
            records: s.records,
            hold: (rt) => (s.agent = rt),
            slot,
            onQueue: queued,
            signal: cut,
          });
        }
        ready = true;
        timing.sandbox_ms = Math.round(performance.now() - t1);
        if (seed) {
          // Its sandbox runs from the snapshot: the group is told once it is removed.
          if (fork && !fork.lead) s.forkMember = fork;
          // A member starts where the leader's setup left off: files, info and state.
          Object.assign(s.trace.info, structuredClone(seed.info));
          Object.assign(s.state, structuredClone(seed.state));
          s.trace.runtime.forked_from = seed.leader;
          return;
        }
        await task.setup(s.ctx(s.agent!, cut));
        await grantAgentUser(s.agent!, task);
        if (fork?.lead && fork.wanted && s.leading === fork) await seedGroup(s, fork, cut);
      }, { seconds: s.timeout("setup"), signal });
      return;
    } catch (raw) {
      let error = raw;
      if (!ready && raw instanceof TaskError && /timed out/.test(raw.message)) {
        error = new SandboxUnavailableError(
          `The agent sandbox did not become ready within the setup timeout ` +
            `(${s.timeout("setup")}s)`,
          { cause: raw },
        );
      }
      // The members set up on their own now, not after this leader's retries.
      s.leading?.settle(null);
      s.leading = null;
      const stale = s.agent;
      s.agent = null;
      if (!box) await stale?.stop().catch(() => {});
      await s.releaseNetwork();
      // The failed attempt's sandbox is not what a replay should serve.
      s.records.splice(0);
      if (signal?.aborted || attempt >= retries || !isSandboxInfra(error)) throw error;
      // Back off before asking the backend again: 0.25 s, 0.5 s, 1 s, ... (max 5 s).
      await new Promise((r) => setTimeout(r, Math.min(5_000, 250 * 2 ** attempt)));
    }
  }
}

/**
 * The harness's program baked into the agent's image, on a runtime that starts sandboxes
 * from images vf builds: once for every rollout of the image (outside the setup timeout,
 * which one rollout's share of a slow first build would not fit), never for a replay.
 */
async function bakeAgentImage(s: RolloutState): Promise<void> {
  const { policy, signal } = s.options;
  const spec = s.agentSpec!;
  if (!policy.harness.bakeImage || policy.sandboxes?.replaying) return;
  if (!("image" in spec) || !spec.image || !traitsOf(spec).imageBuilds) return;
  const image = await policy.harness.bakeImage(spec.image, { signal });
  if (image !== spec.image) s.agentSpec = { ...spec, image } as RuntimeSpec;
}

/**
 * The group's leader, its setup done: snapshot the sandbox so the members start from it.
 * Anything that makes the sandbox unfit to copy (services, a runtime without snapshots,
 * state that cannot be cloned, a failed commit) leaves the members to set up on their own.
 */
async function seedGroup(s: RolloutState, fork: ForkLead, signal: AbortSignal): Promise<void> {
  const agent = s.agent!;
  const task = s.options.task;
  const services = s.compose;
  if (!agent.snapshot || services !== null) {
    warnOnce(
      services !== null
        ? `fork_group: tasks with services set up every rollout (a snapshot holds no services)`
        : `fork_group: the ${agent.type} runtime cannot snapshot a sandbox; every rollout sets up`,
    );
    return fork.settle(null);
  }
  let info: Record<string, unknown>;
  let state: Record<string, unknown>;
  try {
    info = JSON.parse(JSON.stringify(s.trace.info));
    state = structuredClone(s.state);
  } catch (error) {
    warnOnce(
      `fork_group: task "${task.key}" keeps state setup cannot hand on ` +
        `(${error instanceof Error ? error.message : error}); every rollout sets up`,
    );
    return fork.settle(null);
  }
  try {
    // Not cut by the setup's signal: a commit the engine finishes anyway would leave an image
    // nobody tracks; one that ends after a timeout is removed by settle().
    const snapshot = await agent.snapshot();
    fork.settle({ image: snapshot.image, leader: s.trace.trace_id, info, state }, snapshot);
  } catch (error) {
    if (signal.aborted) throw error;
    warnOnce(
      `fork_group: snapshotting the sandbox of task "${task.key}" failed ` +
        `(${error instanceof Error ? error.message : error}); its rollouts set up on their own`,
    );
    fork.settle(null);
  }
}

/**
 * Open the rollout's toolsets (the run's own ones and the task's) beside the run's shared
 * ones; a replay answers them from its record, a run keeps a record of their calls.
 */
export async function openTools(s: RolloutState): Promise<void> {
  const { task, policy, signal } = s.options;
  const toolsets = [
    ...(s.options.toolsets ?? []).filter((t) => !t.shared),
    ...task.toolsets(),
  ];
  const shared = s.options.sharedTools;
  if (!toolsets.length && !shared) return;
  const ctx = {
    state: s.state,
    runtime: s.agent ?? undefined,
    user: task.data.agent_user,
    roots: task.data.workdir ? [task.data.workdir] : [],
    sampling: true,
    run: s.options.runId,
    signal,
  };
  const recorded = policy.sandboxes?.recordedTools?.(
    task.key,
    s.options.rolloutIndex ?? 0,
  ) as ToolboxRecord | null | undefined;
  if (recorded) {
    // Servers in other processes answer from the record; TypeScript tools run again.
    s.toolbox = await Toolbox.fromRecord(recorded).with(
      toolsets.filter((t) => t.tools !== undefined),
      ctx,
    );
    return;
  }
  s.toolbox = shared ? await shared.with(toolsets, ctx) : await Toolbox.open(toolsets, ctx);
  s.toolRecord = { tools: s.toolbox.externalTools, calls: [] };
  s.toolbox.record = s.toolRecord;
}
