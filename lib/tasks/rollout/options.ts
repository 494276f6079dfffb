/**
 * What a task rollout is given (its options and the agent policy) and what it hands back
 * beside its trace (segments, the record of its sandboxes and toolsets).
 * @module
 */
import type { SandboxSource } from "../../../runtimes/pool.ts";
import type { Runtime, RuntimeSpec } from "../../../runtimes/runtime.ts";
import type { ChatClient } from "../../model/client.ts";
import type { ComposeCache } from "../../services/cache.ts";
import type { Judge } from "../../scoring/judges/judge.ts";
import type { Toolbox, ToolboxRecord } from "../../tools/toolbox.ts";
import type { ToolsetSpec } from "../../tools/toolset.ts";
import type { Messages, SamplingArgs } from "../../types.ts";
import type { GroupForks } from "../fork.ts";
import type { Harness, TokenLimits } from "../harness.ts";
import type { SandboxRecord } from "../record.ts";
import type { RuntimeConfig, ScoringConfig, Task, TaskTimeouts } from "../task.ts";

/** How the agent runs and where it is graded (from `[env.agent]`). */
export interface AgentPolicy {
  runtime: RuntimeConfig;
  harness: Harness;
  /** Overrides merged over each task's `scoring`. */
  scoring?: ScoringConfig;
  maxTurns?: number;
  /** Token budgets over the whole rollout (soft by one call); none by default. */
  tokenLimits?: TokenLimits;
  toolTimeoutSeconds?: number;
  /** Per-phase limits in seconds that beat the task's own `timeout`. */
  timeouts?: TaskTimeouts;
  /**
   * Where sandboxes come from (sandbox limits, a warm pool for agent sandboxes); default:
   * created and started here. Grading sandboxes are requested with `role: "grader"` and are
   * always fresh.
   */
  sandboxes?: SandboxSource;
  /**
   * Fresh sandboxes tried after the agent sandbox fails to be created, reached or made ready
   * (a `SandboxError` during setup); default 2.
   */
  infraRetries?: number;
}

/** A started sandbox that rollouts borrow (see {@link TaskRolloutOptions.box}). */
export interface Box {
  runtime: Runtime;
  spec: RuntimeSpec;
}

/** Options of {@link runTaskRollout}. */
export interface TaskRolloutOptions {
  task: Task;
  tasksetId: string;
  policy: AgentPolicy;
  client: ChatClient;
  model: string;
  samplingArgs?: SamplingArgs;
  runId: string;
  rolloutIndex?: number;
  signal?: AbortSignal;
  /** Reads `${VAR}` for scoring env templates; default the process environment. */
  env?: (name: string) => string | undefined;
  /** The role this agent plays in its episode; default `agent`. */
  role?: string;
  /** Whether the trace is training data; default true (judges and simulated users are not). */
  trainable?: boolean;
  /**
   * A started sandbox lent by the caller: the rollout works in it but never starts, retries
   * or stops it.
   */
  box?: Box;
  /**
   * The run's fork groups (`fork_group`): the group's first rollout sets up and snapshots
   * its sandbox, the others start from the snapshot without setup. Not with `box`.
   */
  forks?: GroupForks;
  /** Keep the declared artifacts on {@link TaskRollout.view} in shared scoring mode too. */
  keepArtifacts?: boolean;
  /** The task's prompt is not sent: the first step brings the user's message. */
  promptless?: boolean;
  /** The rollout's state; default `task.initialState()`. */
  state?: Record<string, unknown>;
  /** Judges run after the task's own rewards (phase `judge`); their rewards join the total. */
  judges?: Judge[];
  /** The run's toolsets, opened for this rollout beside the task's own. */
  toolsets?: ToolsetSpec[];
  /** The run's shared toolsets, already open (offered, never closed, by the rollout). */
  sharedTools?: Toolbox;
  /** A Compose file for tasks that declare no services of their own (`[env.services]`). */
  services?: string;
  /** Where Compose specs are parsed, once for every rollout sharing it; default this rollout's own. */
  composeCache?: ComposeCache;
}

/** One segment of a rollout: what the agent did after the user's turn, and whether it can go on. */
export interface Segment {
  /** Messages the segment added after the user's turn: assistant replies and tool results. */
  messages: Messages;
  /** True when the run ended instead of answering: a limit, an error, or no reply. */
  terminated: boolean;
  /** The text of the rollout's last assistant message so far. */
  lastReply: string;
}

/**
 * What a finished rollout's sandboxes and toolsets did (the run writes it to `record.jsonl`
 * for `vf replay`).
 */
export interface RolloutRecord {
  /** Every sandbox's operations, in order. */
  sandboxes: SandboxRecord[];
  /** The toolsets' calls, when the rollout opened any. */
  tools: ToolboxRecord | null;
}
