/**
 * One task rollout, start to finish: agent sandbox → setup → harness → finalize → collect
 * artifacts → score (in the agent's sandbox, or in a fresh grading sandbox that gets only the
 * artifacts plus privately staged tests) → trace.
 * @module
 */
import process from "node:process";
import { posix } from "node:path";
import {
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxImageError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "../../runtimes/errors.ts";
import type { SandboxSource } from "../../runtimes/pool.ts";
import type { SandboxSlot } from "../../runtimes/limits.ts";
import { createRuntime } from "../../runtimes/create.ts";
import { dedicatedHolderOf } from "../../runtimes/ssh/runtime.ts";
import type { Runtime, RuntimeSpec } from "../../runtimes/runtime.ts";
import { excludeMatcher, joinTars, packTar, readTar, type TarEntry } from "../../runtimes/_tar.ts";
import type { ChatClient } from "../model/client.ts";
import { withCacheSalt } from "../model/cache.ts";
import { resolveTemplate } from "../config.ts";
import {
  ConfigError,
  EnvError,
  InfraError,
  ModelError,
  SandboxError,
  type SerializedError,
  serializeError,
  TaskError,
} from "../errors.ts";
import {
  type Harness,
  type HarnessContext,
  type HarnessRecorder,
  type ModelCallRecord,
  StopFired,
  StopHookError,
  type ToolCallRecord,
} from "./harness.ts";
import {
  type Artifact,
  DEFAULT_ARTIFACT_MAX_BYTES,
  type RuntimeConfig,
  type ScoringConfig,
  type StopHook,
  Task,
  type TaskData,
  type TaskHookContext,
  type TaskScores,
  type TaskTimeouts,
  type TraceView,
} from "./task.ts";
import type { Messages, SamplingArgs } from "../types.ts";
import { type Judge, judgeUsage } from "../scoring/judges/judge.ts";
import { MessageGraph, type MessageNode } from "./graph.ts";
import { Toolbox, type ToolboxRecord } from "../tools/toolbox.ts";
import { loadServices, type ServicesSpec } from "../services/compose.ts";
import type { EgressDenial, GatewayRoute } from "../gateway/gateway.ts";
import type { TokenLimits } from "./harness.ts";

const tokenLimitNames = new Set(["max_input_tokens", "max_output_tokens", "max_total_tokens"]);
import { Enclosure } from "./enclosure.ts";
import {
  awaitSeed,
  type ForkLead,
  type ForkMember,
  type ForkSeed,
  type GroupForks,
} from "./fork.ts";
import { recordingRuntime, type SandboxRecord } from "./record.ts";
import { unrefTimer } from "../_timers.ts";
import {
  CLOSED_POLICY,
  composePolicies,
  type NetworkPolicy,
  OPEN_POLICY,
  parseNetworkPolicy,
} from "../gateway/policy.ts";
import type { ToolsetSpec } from "../tools/toolset.ts";

/**
 * Version of trace records. 2 added `role`, `trainable`, `attempt`, `episode_id`,
 * `reward_weights`, `judge_usage` and (for a rewritten history) `nodes`; version 1 lines are
 * read as a single agent's (see `Trace.read`).
 */
export const TRACE_FORMAT_VERSION = 2;

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

/** One rollout's trace, one line of `traces.jsonl`. */
export interface TaskTrace {
  format_version: number;
  trace_id: string;
  run_id: string;
  taskset: string;
  task: { key: string; idx: number; hash: string };
  example_id: number;
  rollout_index: number;
  model: string;
  harness: string;
  /** The role this agent played in its episode (`agent` in a single-agent run). */
  role: string;
  /** Whether this trace is training data (false for judges and simulated users). */
  trainable: boolean;
  /** This role's run number within its episode (0 for the first; best-of-n counts up). */
  attempt: number;
  /** The episode this trace belongs to. */
  episode_id?: string;
  /**
   * `attempts`: agent sandboxes tried when more than one was needed (infrastructure failures
   * retry in a fresh sandbox); absent means the first one worked.
   */
  runtime: {
    type: string;
    image?: string;
    attempts?: number;
    /** fork_group: the trace id of the rollout whose setup (and sandbox snapshot) this one started from. */
    forked_from?: string;
  };
  scoring: { mode: "shared" | "isolated"; attempts: number };
  messages: Messages;
  /**
   * The message graph, when the history was rewritten (more than one branch) or the endpoint
   * returned token ids (`return_token_ids`: `token_ids`/`mask`/`logprobs` per node);
   * otherwise the one branch is `messages`.
   */
  nodes?: MessageNode[];
  model_calls: ModelCallRecord[];
  /** Model requests of this rollout that were retried (set when the trace is written). */
  model_retries?: number;
  tool_calls: ToolCallRecord[];
  stop_condition: string | null;
  reward: number | null;
  /**
   * Reward minus the mean reward of the task's scored rollouts in this run (null when
   * unscored); set on what `runTaskset()` returns, not on the lines written as episodes end.
   */
  advantage?: number | null;
  rewards: Record<string, number>;
  /** Each reward's weight in `reward`, where it is not 1. */
  reward_weights?: Record<string, number>;
  metrics: Record<string, number>;
  /** Tokens the judges' calls used (their replies are in `info.judge`), apart from `usage`. */
  judge_usage?: { input_tokens: number; output_tokens: number };
  /** The egress policy of the agent phase and the connections it refused (every phase). */
  network?: { policy: NetworkPolicy; denied: EgressDenial[] };
  ok: boolean;
  /** `infra`: the failure was infrastructure (sandbox, engine), not the agent's or the task's. */
  error: (SerializedError & { phase: string; infra?: boolean }) | null;
  usage: { input_tokens: number; output_tokens: number };
  /**
   * `started_at` (epoch seconds) and milliseconds per phase (`setup_ms`, `sandbox_ms`,
   * `agent_ms`, `finalize_ms`, `artifacts_ms`, `scoring_ms`, `judge_ms`, `total_ms`). In
   * isolated scoring the grader starts while the artifacts are collected, so `artifacts_ms`
   * lies within `scoring_ms`.
   */
  timing: Record<string, number>;
  info: Record<string, unknown>;
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
}

function memoryString(m: number | string | undefined): string | undefined {
  if (m === undefined) return undefined;
  return typeof m === "number" ? `${Math.round(m * 1024)}m` : m;
}

const warned = new Set<string>();
function warnOnce(message: string): void {
  if (warned.has(message)) return;
  warned.add(message);
  console.warn(message);
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
 * What each finished trace's sandboxes and toolsets did (the run writes it to `record.jsonl`
 * for `vf replay`).
 */
export const SANDBOX_RECORDS: WeakMap<
  TaskTrace,
  { sandboxes: SandboxRecord[]; tools: ToolboxRecord | null }
> = new WeakMap();

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

/** Drop tar entries matching `exclude` globs (at any depth below the artifact's root, as tar). */
export function filterTar(tar: Uint8Array, exclude: string[]): Uint8Array {
  if (exclude.length === 0) return tar;
  const excluded = excludeMatcher(exclude);
  const entries: TarEntry[] = [];
  for (const rec of readTar(tar)) {
    const rel = rec.name.replace(/^[^/]+\/?/, "");
    if (rel && excluded(rel.replace(/\/$/, ""))) continue;
    if (rec.typeflag === "5") entries.push({ name: rec.name, type: "directory", mode: rec.mode });
    else if (rec.typeflag === "0" || rec.typeflag === "" || rec.typeflag === "\0") {
      entries.push({ name: rec.name, type: "file", data: rec.data, mode: rec.mode });
    }
  }
  return packTar(entries);
}

function absolute(path: string, workdir: string | undefined): string {
  return posix.isAbsolute(path) ? path : posix.join(workdir ?? "/", path);
}

/** Resolves once `work` settles, or after `ms` (its timer cleared either way). */
function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = unrefTimer(setTimeout(resolve, ms));
    const done = () => {
      clearTimeout(timer);
      resolve();
    };
    work.then(done, done);
  });
}

/** The longest delay a timer takes (a longer one would fire at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Race a phase against its timeout (seconds) and the run's signal. `fn` can stop the
 * timeout's clock while it waits its turn (for a sandbox slot under [limits]) and start it
 * afresh once served: queueing behind other rollouts is not the phase taking too long.
 */
async function phase<T>(
  name: string,
  seconds: number | undefined,
  signal: AbortSignal | undefined,
  fn: (signal: AbortSignal, queued: (waiting: boolean) => void) => Promise<T>,
  /** The timeout to name when it passes, when `seconds` is what was left of it. */
  stated: number | undefined = seconds,
  /** Gets `fn`'s own promise, which may still run after the phase was cut short. */
  running?: (work: Promise<T>) => void,
): Promise<T> {
  const controller = new AbortController();
  const signals = [controller.signal, ...(signal ? [signal] : [])];
  const clock = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = unrefTimer(setTimeout(() => {
      clock.abort(new DOMException(`Timed out after ${seconds} s`, "TimeoutError"));
    }, Math.min(seconds! * 1000, MAX_TIMER_MS)));
  };
  if (seconds && seconds > 0) {
    signals.push(clock.signal);
    arm();
  }
  const queued = (waiting: boolean) => {
    if (!(seconds && seconds > 0) || clock.signal.aborted) return;
    if (waiting) clearTimeout(timer);
    else arm();
  };
  const combined = AbortSignal.any(signals);
  return await new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      const reason = combined.reason;
      reject(
        reason instanceof DOMException && reason.name === "TimeoutError"
          ? new TaskError(`Phase "${name}" timed out after ${stated}s`, { cause: reason })
          : reason,
      );
    };
    if (combined.aborted) return onAbort();
    combined.addEventListener("abort", onAbort, { once: true });
    const work = fn(combined, queued);
    running?.(work);
    work.then(resolve, reject).finally(() => combined.removeEventListener("abort", onAbort));
  }).finally(() => {
    clearTimeout(timer);
    controller.abort();
  });
}

class PhaseError extends Error {
  constructor(readonly phase: string, readonly error: unknown) {
    super(String(error));
  }
}

async function inPhase<T>(name: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    if (error instanceof PhaseError) throw error;
    throw new PhaseError(name, error);
  }
}

/** Make workspace paths writable for `agent_user` (setup runs as the default user). */
async function grantAgentUser(runtime: Runtime, task: Task, user: string): Promise<void> {
  const paths = new Set<string>();
  if (task.data.workdir) paths.add(task.data.workdir);
  for (const a of task.data.artifacts ?? []) paths.add(absolute(a.source, task.data.workdir));
  paths.add("/logs/artifacts");
  const script = 'for p in "$@"; do mkdir -p "$p" 2>/dev/null || true; chown -R "$0" "$p"; done';
  const r = await runtime.run(["sh", "-c", script, user, ...paths]);
  if (r.exit_code !== 0) {
    throw new TaskError(
      `Cannot make the workspace writable for agent_user "${user}": ${r.stderr.trim()}`,
    );
  }
}

/** Copy declared artifacts (and /logs/artifacts) out of a sandbox. */
export async function collectArtifacts(
  runtime: Runtime,
  task: Task,
): Promise<Map<string, Uint8Array | null>> {
  const out = new Map<string, Uint8Array | null>();
  const limit = task.data.artifact_max_bytes ?? DEFAULT_ARTIFACT_MAX_BYTES;
  let total = 0;
  const declared: Artifact[] = [...(task.data.artifacts ?? []), {
    source: "/logs/artifacts",
    required: false,
  }];
  for (const artifact of declared) {
    const path = absolute(artifact.source, task.data.workdir);
    if (out.has(path)) continue;
    let tar: Uint8Array;
    try {
      // Excluded entries and anything past the remaining budget are never held.
      tar = await runtime.archiveOut(path, {
        maxBytes: limit - total,
        exclude: artifact.exclude ?? [],
      });
    } catch (error) {
      if (error instanceof SandboxFileTooLargeError) {
        throw new TaskError(
          `Artifacts exceed artifact_max_bytes (${limit} bytes) at "${artifact.source}"; ` +
            `exclude files or raise TaskData.artifact_max_bytes`,
        );
      }
      if (error instanceof SandboxFileNotFoundError) {
        if (artifact.required ?? true) {
          // Blame the task only once the sandbox proves it is still there: a sandbox that
          // vanished (removed by another process, its engine restarted) is infrastructure.
          await runtime.run(["true"], { timeoutMs: 30_000 });
          throw new TaskError(
            `Required artifact "${artifact.source}" is missing in the agent sandbox`,
          );
        }
        out.set(path, null);
        continue;
      }
      throw error;
    }
    total += tar.length;
    if (total > limit) {
      throw new TaskError(
        `Artifacts exceed artifact_max_bytes (${limit} bytes) at "${artifact.source}"; ` +
          `exclude files or raise TaskData.artifact_max_bytes`,
      );
    }
    out.set(path, tar);
  }
  return out;
}

/**
 * Restore artifacts into a sandbox, replacing whatever is at those paths: one command clears
 * them and one upload puts every artifact back.
 */
export async function restoreArtifacts(
  runtime: Runtime,
  artifacts: Map<string, Uint8Array | null>,
): Promise<void> {
  const present = [...artifacts].filter((entry): entry is [string, Uint8Array] => !!entry[1]);
  if (present.length === 0) return;
  const paths = present.map(([path]) => path);
  const rm = await runtime.run(["rm", "-rf", "--", ...paths]);
  if (rm.exit_code !== 0) {
    throw new SandboxError(
      `Cannot clear ${paths.map((p) => `"${p}"`).join(", ")} before restoring: ${rm.stderr}`,
    );
  }
  const joined = joinTars(present.map(([path, tar]) => ({ under: posix.dirname(path), tar })));
  await runtime.archiveIn("/", joined);
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

function messageText(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) => (typeof p?.text === "string" ? p.text : "")).join("");
  }
  return "";
}

/** The text of the last assistant message in `messages`, or "". */
export function lastReplyOf(messages: Messages): string {
  const last = [...messages].reverse().find((m) => m.role === "assistant");
  return last ? messageText(last.content) : "";
}

/**
 * One task rollout in steps: {@link TaskRollout.open} (sandbox and setup), one or more
 * {@link TaskRollout.step}s (harness segments; later ones resume the conversation with the
 * user's turn), then {@link TaskRollout.close} (finalize, harness metrics, artifacts, scoring,
 * teardown). Failures are recorded on the trace, never thrown; an interrupt (the signal) is
 * thrown, and {@link TaskRollout.dispose} then stops what is still running.
 */
export class TaskRollout {
  readonly trace: TaskTrace;
  readonly view: TraceView;
  /** This rollout's own state, shared by the task's hooks, its rewards and the harness. */
  readonly state: Record<string, unknown>;
  readonly #options: TaskRolloutOptions;
  readonly #recorder: HarnessRecorder;
  readonly #scoring: ScoringConfig;
  readonly #mode: "shared" | "isolated";
  readonly #t0 = performance.now();
  #agentSpec: RuntimeSpec | null = null;
  #agent: Runtime | null = null;
  #opened = false;
  #failed = false;
  #closed = false;
  #segments = 0;
  #agentMs = 0;
  #stopList: StopHook[] | null = null;
  #toolbox: Toolbox | null = null;
  #enclosure: Enclosure | null = null;
  /** Every sandbox's operations, in order (what `record.jsonl` keeps for vf replay). */
  readonly sandboxRecords: SandboxRecord[] = [];
  #toolRecord: ToolboxRecord | null = null;
  #gateway: GatewayRoute | null = null;
  #egress: NetworkPolicy | null = null;

  get #stops(): StopHook[] {
    return this.#stopList ??= this.#options.task.stopHooks();
  }

  constructor(options: TaskRolloutOptions) {
    this.#options = options;
    const { task, policy } = options;
    const data = task.data;
    const scoring: ScoringConfig = { ...(data.scoring ?? {}), ...(policy.scoring ?? {}) };
    if (data.scoring?.env || policy.scoring?.env) {
      scoring.env = { ...(data.scoring?.env ?? {}), ...(policy.scoring?.env ?? {}) };
    }
    this.#scoring = scoring;
    this.#mode = scoring.mode ?? "shared";
    if (this.#mode === "shared" && scoring.env && Object.keys(scoring.env).length > 0) {
      warnOnce(
        "scoring.env applies to the isolated grading sandbox only; it is ignored in shared scoring mode",
      );
    }
    this.#recorder = {
      messages: [],
      model_calls: [],
      tool_calls: [],
      stop_condition: null,
      usage: { input_tokens: 0, output_tokens: 0 },
      metrics: {},
      graph: new MessageGraph(),
    };
    this.state = options.state ?? task.initialState();
    this.view = { info: {}, messages: this.#recorder.messages, artifacts: new Map() };
    const runtimeType = options.box ? options.box.spec.type : policy.runtime.type ?? "docker";
    this.trace = {
      format_version: TRACE_FORMAT_VERSION,
      trace_id: crypto.randomUUID(),
      run_id: options.runId,
      taskset: options.tasksetId,
      task: { key: task.key, idx: data.idx ?? 0, hash: task.hash },
      example_id: data.idx ?? 0,
      rollout_index: options.rolloutIndex ?? 0,
      model: options.model,
      harness: policy.harness.id,
      role: options.role ?? "agent",
      trainable: options.trainable ?? true,
      attempt: 0,
      runtime: { type: runtimeType, image: policy.runtime.image ?? data.image },
      scoring: { mode: this.#mode, attempts: 0 },
      messages: this.#recorder.messages,
      model_calls: this.#recorder.model_calls,
      tool_calls: this.#recorder.tool_calls,
      stop_condition: null,
      reward: null,
      rewards: {},
      metrics: {},
      ok: false,
      error: null,
      usage: this.#recorder.usage,
      timing: { started_at: Date.now() / 1000 },
      info: this.view.info,
    };
  }

  /** The agent's sandbox while the rollout holds it (null before open and after close). */
  get runtime(): Runtime | null {
    return this.#agent;
  }

  /** Whether the rollout has failed (the error is on the trace). */
  get failed(): boolean {
    return this.#failed;
  }

  /** The rollout's state as a task hook sees it. */
  #ctx(runtime: Runtime, signal?: AbortSignal): TaskHookContext {
    const { task, runId } = this.#options;
    return {
      runtime,
      task,
      data: task.data,
      trace: this.view,
      state: this.state,
      runId,
      tools: this.#toolbox ?? undefined,
      signal,
    };
  }

  #timeout(stage: keyof TaskTimeouts): number | undefined {
    return this.#options.policy.timeouts?.[stage] ?? this.#options.task.data.timeout?.[stage];
  }

  async #timed<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.trace.timing[`${key}_ms`] = Math.round(performance.now() - t0);
    }
  }

  /** Record a failure on the trace; an interrupt is thrown instead. */
  #fail(raw: unknown): void {
    const phaseName = raw instanceof PhaseError ? raw.phase : "rollout";
    const error = raw instanceof PhaseError ? raw.error : raw;
    const signal = this.#options.signal;
    if (signal?.aborted) throw signal.reason; // interrupted: not a result, nothing to record
    this.#failed = true;
    this.trace.ok = false;
    this.trace.error = { ...serializeError(error), phase: phaseName };
    // The model endpoint failing after its retries is infrastructure too (a bad key ends the run).
    // The model endpoint failing after its retries is infrastructure too (a bad key ends the
    // run). That includes replies vf cannot use at all (malformed JSON, no choices, an empty
    // message): the endpoint's or the model's, they cannot be told apart here.
    if (error instanceof InfraError || error instanceof ModelError) this.trace.error.infra = true;
    this.trace.stop_condition ??= this.#recorder.stop_condition ?? "has_error";
  }

  /** Start (or borrow) the agent's sandbox and run the task's setup; false when it failed. */
  async open(): Promise<boolean> {
    if (this.#opened || this.#failed) return !this.#failed;
    const { task, policy, signal } = this.#options;
    const data = task.data;
    const timing = this.trace.timing;
    const box = this.#options.box;
    try {
      // deno-lint-ignore require-await
      this.#agentSpec = await inPhase("config", async () => {
        const spec = box ? box.spec : resolveRuntimeSpec(policy.runtime, task, "agent");
        if (this.#mode === "isolated" && spec.type === "subprocess") {
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
        this.#egress = resolveNetworkPolicy(policy.runtime, task);
        if (this.#egress && spec.type !== "docker") {
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
        if (box && (this.#egress || policy.harness.needsGateway)) {
          throw new ConfigError(
            `Task "${task.key}" needs a network of its own (a gateway or a network policy), which ` +
              `a borrowed sandbox does not have; run it in its own sandbox`,
          );
        }
        return spec;
      });
      const retries = box ? 0 : policy.infraRetries ?? 2;
      const fork = box ? null : this.#options.forks?.join(
        `${this.#options.role ?? "agent"}\0${task.key}`,
      ) ?? null;
      if (fork?.lead) this.#leading = fork;
      let seed: ForkSeed | null = null;
      await inPhase("setup", () =>
        this.#timed("setup", async () => {
          // A member waits for its leader's setup and snapshot outside its own setup timeout
          // (counted in it, a slow leader made every member time out and set up anyway). The
          // leader's first attempt bounds the wait: it settles the group however that ends.
          if (fork && !fork.lead) seed = await (signal ? awaitSeed(fork, signal) : fork.seed);
          for (let attempt = 0;; attempt++) {
            if (attempt > 0) this.trace.runtime.attempts = attempt + 1;
            let ready = false;
            try {
              await phase("setup", this.#timeout("setup"), signal, async (s, queued) => {
                const t1 = performance.now();
                if (box) {
                  if ((task.deploymentSpec() ?? this.#options.services ?? null) !== null) {
                    throw new ConfigError(
                      `Task "${task.key}" has services, which a borrowed sandbox does not bring; ` +
                        `run it in its own sandbox`,
                    );
                  }
                  this.#agent = box.runtime;
                } else {
                  const own = this.#agentSpec!;
                  // Waiting for a sandbox slot under [limits] is not setup taking too long.
                  const spec = await this.#prepareNetwork(
                    seed ? { ...own, image: seed.image } as RuntimeSpec : own,
                    s,
                    queued,
                  );
                  const slot = this.#agentSlot;
                  this.#agentSlot = undefined;
                  await startSandbox(
                    seed ? unpooled(policy) : policy,
                    spec,
                    "agent",
                    this.#options,
                    s,
                    (rt) => (this.#agent = rt),
                    this.sandboxRecords,
                    slot,
                    queued,
                  );
                }
                ready = true;
                timing.sandbox_ms = Math.round(performance.now() - t1);
                if (seed) {
                  // Its sandbox runs from the snapshot: the group is told once it is removed.
                  if (fork && !fork.lead) this.#forkMember = fork;
                  // A member starts where the leader's setup left off: files, info and state.
                  Object.assign(this.trace.info, structuredClone(seed.info));
                  Object.assign(this.state, structuredClone(seed.state));
                  this.trace.runtime.forked_from = seed.leader;
                  return;
                }
                await task.setup(this.#ctx(this.#agent!, s));
                if (data.agent_user) await grantAgentUser(this.#agent!, task, data.agent_user);
                if (fork?.lead && fork.wanted && this.#leading === fork) {
                  await this.#seedGroup(fork, s);
                }
              });
              return;
            } catch (raw) {
              let error = raw;
              if (!ready && raw instanceof TaskError && /timed out/.test(raw.message)) {
                error = new SandboxUnavailableError(
                  `The agent sandbox did not become ready within the setup timeout ` +
                    `(${this.#timeout("setup")}s)`,
                  { cause: raw },
                );
              }
              // The members set up on their own now, not after this leader's retries.
              this.#leading?.settle(null);
              this.#leading = null;
              const stale = this.#agent;
              this.#agent = null;
              if (!box) await stale?.stop().catch(() => {});
              await this.#releaseNetwork();
              // The failed attempt's sandbox is not what a replay should serve.
              this.sandboxRecords.splice(0);
              if (signal?.aborted || attempt >= retries || !isSandboxInfra(error)) throw error;
              // Back off before asking the backend again: 0.25 s, 0.5 s, 1 s, ... (max 5 s).
              await new Promise((r) => setTimeout(r, Math.min(5_000, 250 * 2 ** attempt)));
            }
          }
        }));
      const toolsets = [
        ...(this.#options.toolsets ?? []).filter((t) => !t.shared),
        ...task.toolsets(),
      ];
      const shared = this.#options.sharedTools;
      if (toolsets.length || shared) {
        await inPhase("setup", async () => {
          const ctx = {
            state: this.state,
            runtime: this.#agent ?? undefined,
            user: data.agent_user,
            signal,
          };
          // A replay answers the toolsets from the record; a run keeps a record of its calls.
          const recorded = policy.sandboxes?.recordedTools?.(
            task.key,
            this.#options.rolloutIndex ?? 0,
          ) as ToolboxRecord | null | undefined;
          if (recorded) {
            // Servers in other processes answer from the record; TypeScript tools run again.
            this.#toolbox = await Toolbox.fromRecord(recorded).with(
              toolsets.filter((t) => t.tools !== undefined),
              ctx,
            );
            return;
          }
          this.#toolbox = shared
            ? await shared.with(toolsets, ctx)
            : await Toolbox.open(toolsets, ctx);
          this.#toolRecord = { tools: this.#toolbox.externalTools, calls: [] };
          this.#toolbox.record = this.#toolRecord;
        });
      }
      // The agent works under the task's policy (nothing but vf's own routes without one).
      this.#gateway?.session.setPhase("agent", this.#egress ?? CLOSED_POLICY);
      this.#opened = true;
      return true;
    } catch (raw) {
      this.#fail(raw);
      return false;
    } finally {
      // A leader that never got to snapshot lets its members set up on their own.
      this.#leading?.settle(null);
      this.#leading = null;
    }
  }

  /** The fork group this rollout leads, until it has settled it. */
  #leading: ForkLead | null = null;

  /**
   * The group's leader, its setup done: snapshot the sandbox so the members start from it.
   * Anything that makes the sandbox unfit to copy (services, a runtime without snapshots,
   * state that cannot be cloned, a failed commit) leaves the members to set up on their own.
   */
  async #seedGroup(fork: ForkLead, signal: AbortSignal): Promise<void> {
    const agent = this.#agent!;
    const services = this.#options.task.deploymentSpec() ?? this.#options.services ?? null;
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
      info = JSON.parse(JSON.stringify(this.trace.info));
      state = structuredClone(this.state);
    } catch (error) {
      warnOnce(
        `fork_group: task "${this.#options.task.key}" keeps state setup cannot hand on ` +
          `(${error instanceof Error ? error.message : error}); every rollout sets up`,
      );
      return fork.settle(null);
    }
    try {
      // Not cut by the setup's signal: a commit the engine finishes anyway would leave an image
      // nobody tracks; one that ends after a timeout is removed by settle().
      const snapshot = await agent.snapshot();
      fork.settle({ image: snapshot.image, leader: this.trace.trace_id, info, state }, snapshot);
    } catch (error) {
      if (signal.aborted) throw error;
      warnOnce(
        `fork_group: snapshotting the sandbox of task "${this.#options.task.key}" failed ` +
          `(${error instanceof Error ? error.message : error}); its rollouts set up on their own`,
      );
      fork.settle(null);
    }
  }

  /**
   * Run one harness segment: the first runs from the task's prompt (or, for a prompt-less
   * rollout, from `messages`); later ones resume after appending `messages` as the user's turn.
   * The agent timeout is one budget over all segments.
   */
  async step(messages?: Messages): Promise<Segment> {
    const recorder = this.#recorder;
    const done = (): Segment => ({
      messages: [],
      terminated: true,
      lastReply: lastReplyOf(recorder.messages),
    });
    if (!this.#opened || this.#failed || this.#closed) return done();
    const { task, policy, signal } = this.#options;
    const first = this.#segments === 0;
    const promptless = this.#options.promptless === true;
    if (first && promptless !== Boolean(messages?.length)) {
      throw new TypeError(
        promptless
          ? `A prompt-less rollout of task "${task.key}" opens with the user's message: turn("...")`
          : `Task "${task.key}" has a prompt: open its interaction with a bare turn()`,
      );
    }
    if (!first && !messages?.length) {
      throw new TypeError('A later turn needs the user\'s message: turn("...")');
    }
    if (!first && !policy.harness.resume) {
      throw new ConfigError(`Harness "${policy.harness.id}" cannot resume a conversation`);
    }
    this.#segments++;
    const before = recorder.messages.length + (first ? 0 : messages!.length);
    const budget = this.#timeout("agent");
    const remaining = budget ? Math.max(0.001, budget - this.#agentMs / 1000) : undefined;
    const t0 = performance.now();
    try {
      await inPhase("agent", () =>
        phase("agent", remaining, signal, (s) => {
          const ctx: HarnessContext = {
            task,
            data: first && promptless ? { ...task.data, prompt: messages! } : task.data,
            runtime: this.#agent!,
            client: withCacheSalt(this.#options.client, String(this.#options.rolloutIndex ?? 0)),
            model: this.#options.model,
            samplingArgs: this.#options.samplingArgs ?? {},
            recorder,
            maxTurns: policy.maxTurns ?? 30,
            tokenLimits: policy.tokenLimits,
            toolTimeoutMs: (policy.toolTimeoutSeconds ?? 600) * 1000,
            user: task.data.agent_user,
            state: this.state,
            stops: this.#stops,
            toolbox: this.#toolbox ?? undefined,
            gateway: this.#gateway ?? undefined,
            signal: s,
          };
          return first ? policy.harness.run(ctx) : policy.harness.resume!(ctx, messages!);
        }));
      this.trace.stop_condition = recorder.stop_condition;
    } catch (raw) {
      const error = raw instanceof PhaseError ? raw.error : raw;
      // A stop condition that a custom harness let through is a clean end, not a failure.
      if (error instanceof StopFired) this.trace.stop_condition = error.condition;
      else if (error instanceof StopHookError) this.#fail(new PhaseError("stop", error));
      else this.#fail(raw);
    } finally {
      this.#agentMs += performance.now() - t0;
      this.trace.timing.agent_ms = Math.round(this.#agentMs);
    }
    const added = recorder.messages.slice(before);
    const replied = added.some((m) => m.role === "assistant");
    const stopped = recorder.stop_condition === "max_turns_reached" ||
      tokenLimitNames.has(recorder.stop_condition ?? "") ||
      this.#stops.some((s) => s.name === recorder.stop_condition);
    return {
      messages: added,
      terminated: this.#failed || !replied || stopped,
      lastReply: lastReplyOf(recorder.messages),
    };
  }

  /**
   * Finish the rollout: the task's finalize and the harness's metrics with the agent's sandbox
   * still up, artifacts, scoring (shared or isolated), then teardown. Idempotent.
   */
  async close(options: { stopCondition?: string } = {}): Promise<TaskTrace> {
    if (this.#closed) return this.trace;
    this.#closed = true;
    const { task, policy, signal } = this.#options;
    const data = task.data;
    const trace = this.trace;
    const timing = trace.timing;
    // The agent is done: its program gets no more model calls.
    if (this.#gateway) this.#gateway.session.handler = null;
    try {
      if (this.#opened && !this.#failed && this.#segments === 0) {
        // Closed before the agent ever ran (its Env gave up first): nothing to score.
        throw new PhaseError(
          "env",
          new EnvError(`The rollout of task "${task.key}" was closed before the agent ran`),
        );
      }
      if (this.#opened && !this.#failed) {
        if (options.stopCondition) trace.stop_condition = options.stopCondition;
        await inPhase(
          "finalize",
          () =>
            this.#timed(
              "finalize",
              () =>
                phase("finalize", this.#timeout("finalize"), signal, async (s) => {
                  await task.finalize(this.#ctx(this.#agent!, s));
                  const own = await policy.harness.metrics?.({
                    task,
                    data,
                    runtime: this.#agent!,
                    client: this.#options.client,
                    model: this.#options.model,
                    samplingArgs: this.#options.samplingArgs ?? {},
                    recorder: this.#recorder,
                    maxTurns: policy.maxTurns ?? 30,
                    toolTimeoutMs: (policy.toolTimeoutSeconds ?? 600) * 1000,
                    user: data.agent_user,
                    state: this.state,
                    signal: s,
                  });
                  Object.assign(this.#recorder.metrics, own ?? {});
                }),
            ),
        );
        let scores: TaskScores;
        if (this.#mode === "shared") {
          if (this.#options.keepArtifacts) {
            // Before scoring: private tests staged for grading must not travel with them.
            this.view.artifacts = await inPhase(
              "artifacts",
              () => this.#timed("artifacts", () => collectArtifacts(this.#agent!, task)),
            );
          }
          trace.scoring.attempts = 1;
          scores = await inPhase(
            "scoring",
            () =>
              this.#timed(
                "scoring",
                () =>
                  phase("scoring", this.#timeout("scoring"), signal, async (s) => {
                    // The agent is done: private tests may be staged in its sandbox now
                    // (under the setup policy), then graded under the grader's.
                    this.#gateway?.session.setPhase("setup", OPEN_POLICY);
                    await task.stageVerifier(this.#ctx(this.#agent!, s));
                    this.#gateway?.session.setPhase("grade", this.#graderPolicy());
                    return await task.score(this.#ctx(this.#agent!, s));
                  }),
              ),
          );
        } else {
          scores = await this.#scoreIsolated();
        }
        const judges = this.#options.judges ?? [];
        if (judges.length) {
          scores = await inPhase(
            "judge",
            () =>
              this.#timed(
                "judge",
                () =>
                  phase("judge", this.#timeout("scoring"), signal, (s) =>
                    judgeScores(scores, judges, data, this.view, s)),
              ),
          );
        }
        trace.reward = scores.reward;
        trace.rewards = scores.rewards;
        const weights = Object.entries(scores.weights ?? {}).filter(([, w]) => w !== 1);
        if (weights.length) trace.reward_weights = Object.fromEntries(weights);
        trace.metrics = { ...this.#recorder.metrics, ...scores.metrics };
        trace.ok = true;
      }
    } catch (raw) {
      this.#fail(raw);
    } finally {
      await this.dispose();
      const judged = judgeUsage(this.view.info);
      if (judged) trace.judge_usage = judged;
      const graph = this.#recorder.graph!;
      if (graph.leaves().length > 1 || graph.hasTokens) trace.nodes = graph.nodes;
      timing.total_ms = Math.round(performance.now() - this.#t0);
      if (this.sandboxRecords.length || this.#toolRecord) {
        SANDBOX_RECORDS.set(trace, { sandboxes: this.sandboxRecords, tools: this.#toolRecord });
      }
    }
    return trace;
  }

  /** Close the toolsets and stop the agent's sandbox if this rollout owns it and still holds it. */
  async dispose(): Promise<void> {
    const toolbox = this.#toolbox;
    this.#toolbox = null;
    await toolbox?.close();
    await this.#agentStopping;
    await this.#stopAgent();
    await Promise.all(this.#graderStopping.splice(0));
  }

  /** The agent sandbox's removal when it was started off the critical path. */
  #agentStopping: Promise<void> | undefined;
  /** Grading sandboxes' removals, started as soon as their scores were in. */
  #graderStopping: Promise<void>[] = [];

  async #stopAgent(): Promise<void> {
    const agent = this.#agent;
    this.#agent = null;
    let removed = true;
    if (agent && agent !== this.#options.box?.runtime) {
      await agent.stop().catch(() => (removed = false));
    }
    // A snapshot deleted while a container still runs from it is only untagged and left
    // behind: a member whose sandbox could not be removed keeps it until the run ends.
    const member = this.#forkMember;
    this.#forkMember = null;
    if (removed) member?.released();
    await this.#releaseNetwork();
  }

  /** The fork group whose snapshot this rollout's sandbox runs from, until it is removed. */
  #forkMember: ForkMember | null = null;

  /** The grader's egress policy: `scoring.network`, else the agent's. */
  #graderPolicy(): NetworkPolicy {
    const own = this.#scoring.network;
    return own ? parseNetworkPolicy(own, "scoring.network") : this.#egress ?? CLOSED_POLICY;
  }

  /**
   * Give the agent's sandbox what it needs around it (its {@link Enclosure}): a network of its
   * own with the task's services, the gateway relay for an agent program or a network policy.
   * Returns the sandbox's spec joined to it.
   */
  async #prepareNetwork(
    spec: RuntimeSpec,
    signal: AbortSignal,
    onQueue?: (waiting: boolean) => void,
  ): Promise<RuntimeSpec> {
    const { task, policy, runId, model } = this.#options;
    const compose = task.deploymentSpec() ?? this.#options.services ?? null;
    const needs = {
      runId,
      task: task.key,
      model,
      services: compose === null ? null : await loadServices(compose),
      gateway: policy.harness.needsGateway === true,
      egress: this.#egress !== null,
      alias: "agent",
      healthTimeout: this.#timeout("setup"),
      signal,
      onQueue,
    };
    if (!Enclosure.needed(needs)) return spec;
    if (policy.sandboxes?.replaying) {
      // A replay's sandboxes answer from the record: no network, relay or services to build;
      // a program harness still gets a gateway route (on loopback), which nothing will call.
      if (needs.gateway) {
        const opened = await Enclosure.open({ type: "subprocess" }, {
          ...needs,
          services: null,
          egress: false,
        });
        this.#enclosure = opened.enclosure;
        this.#gateway = opened.enclosure.route;
      }
      return spec;
    }
    const opened = await Enclosure.open(spec, needs, policy.sandboxes);
    if (signal.aborted) {
      // The phase ended while it opened (a step that takes no signal): the attempt's cleanup
      // has run already, so nobody else would close it.
      opened.slot?.release();
      await opened.enclosure.close().catch(() => {});
      throw signal.reason;
    }
    this.#enclosure = opened.enclosure;
    this.#gateway = opened.enclosure.route;
    this.#agentSlot = opened.slot;
    return opened.spec;
  }

  /** The live slot the agent's sandbox starts on, taken with its enclosure's. */
  #agentSlot: SandboxSlot | undefined;

  /** Seal the gateway session (its refusals go on the trace), stop services and network. */
  async #releaseNetwork(): Promise<void> {
    const enclosure = this.#enclosure;
    this.#enclosure = null;
    this.#gateway = null;
    const denied = await enclosure?.close() ?? [];
    if (this.#egress || denied.length) this.#recordDenials(denied);
  }

  #recordDenials(denied: EgressDenial[]): void {
    this.trace.network = {
      policy: this.trace.network?.policy ?? this.#egress ?? CLOSED_POLICY,
      denied: [...(this.trace.network?.denied ?? []), ...denied],
    };
  }

  async #scoreIsolated(): Promise<TaskScores> {
    const { task, policy, signal } = this.#options;
    const data = task.data;
    const scoring = this.#scoring;
    const envLookup = this.#options.env ?? ((n: string) => process.env[n]);
    const graderConfig: RuntimeConfig = { ...policy.runtime, ...(scoring.runtime ?? {}) };
    const scoringEnv: Record<string, string> = {};
    for (const [k, v] of Object.entries(scoring.env ?? {})) {
      scoringEnv[k] = resolveTemplate(v, envLookup);
    }
    // deno-lint-ignore require-await
    const graderSpec = await inPhase("scoring", async () => {
      const spec = resolveRuntimeSpec(graderConfig, task, "grader", scoringEnv);
      if (spec.type === "subprocess" || (spec.type === "ssh" && !spec.dedicated)) {
        throw new ConfigError(
          `The grading sandbox must be a fresh, isolated sandbox; a ${spec.type} runtime` +
            `${spec.type === "ssh" ? " on a shared host" : ""} is not one (task "${task.key}"); ` +
            `use docker or prime for --env.agent.scoring.runtime`,
        );
      }
      // A borrowed sandbox stays up through grading: a grader cannot wait for its host.
      const box = this.#options.box?.runtime;
      if (box) requireHostNotKept(spec, box, task, "--env.agent.scoring.runtime");
      const agentWorkdir = this.#agentSpec?.workdir ?? data.workdir;
      const relative = (data.artifacts ?? []).find((a) => !posix.isAbsolute(a.source));
      if (relative && spec.workdir !== agentWorkdir) {
        throw new ConfigError(
          `Relative artifact path "${relative.source}" requires the agent and grading sandboxes to ` +
            `share a workdir ("${agentWorkdir}" vs "${spec.workdir}"); use an absolute path`,
        );
      }
      return spec;
    });
    // The grading sandbox's egress: `scoring.network`, else its runtime's and the task's.
    const graderPolicy = await inPhase("scoring", () => {
      const own = scoring.network;
      const policy = own
        ? parseNetworkPolicy(own, "scoring.network")
        : resolveNetworkPolicy(graderConfig, task, "env.agent.scoring.runtime");
      if (policy && graderSpec.type !== "docker") {
        throw new ConfigError(
          `A network policy is enforced on the docker runtime only; the grading sandbox is ` +
            `${graderSpec.type} (task "${task.key}")`,
        );
      }
      return Promise.resolve(policy);
    });
    // Services for the grader, fresh, when the task asks (`scoring.services`).
    const compose = task.deploymentSpec() ?? this.#options.services ?? null;
    const graderServices = scoring.services && compose !== null
      ? await inPhase("scoring", () => loadServices(compose))
      : null;
    // The artifacts are collected while the grader starts and runs the task's setup, which
    // does not need them; the agent's sandbox is removed once they are out, off the critical
    // path (dispose() waits for it); the toolsets stay up: rewards may still call them.
    const agent = this.#agent!;
    const artifacts = inPhase(
      "artifacts",
      () => this.#timed("artifacts", () => collectArtifacts(agent, task)),
    ).then((collected) => {
      this.view.artifacts = collected;
      // Unless the rollout is already being torn down (dispose() stops the agent then).
      if (this.#agent === agent) this.#agentStopping = this.#stopAgent().catch(() => {});
      return collected;
    });
    artifacts.catch(() => {}); // gradeIsolated awaits it, and a failure is thrown from there
    const denied: EgressDenial[] = [];
    try {
      return await inPhase(
        "scoring",
        () =>
          this.#timed("scoring", () =>
            gradeIsolated(
              graderSpec,
              artifacts,
              scoring.retries ?? 2,
              this.#options,
              this.trace,
              (runtime, s) => this.#ctx(runtime, s),
              this.#timeout("scoring"),
              signal,
              {
                egress: graderPolicy ? { policy: graderPolicy, denied } : undefined,
                services: graderServices,
                records: this.sandboxRecords,
                defer: (removal) => this.#graderStopping.push(removal),
              },
            )),
      );
    } finally {
      if (graderPolicy) this.#recordDenials(denied);
    }
  }
}

/**
 * Grade the work in `ctx.runtime` as an isolated rollout would: its declared artifacts are
 * copied into a fresh grading sandbox (the task's `scoring.runtime`, else its image on
 * Docker), where the task's setup, the restore, `stageVerifier` and its rewards run. For a
 * `validate` hook that exercises the whole flow without a model:
 *
 * ```ts
 * override async validate(ctx: TaskHookContext) {
 *   await ctx.runtime.write("/app/solution.py", GOLD);
 *   return await gradeSubmission(ctx);
 * }
 * ```
 * @throws {InfraError} when grading fails in every fresh sandbox tried (`scoring.retries`)
 */
export async function gradeSubmission(
  ctx: TaskHookContext,
  options: { runtime?: RuntimeConfig } = {},
): Promise<TaskScores> {
  const { task, signal } = ctx;
  const scoring = task.data.scoring ?? {};
  const config: RuntimeConfig = { ...(options.runtime ?? {}), ...(scoring.runtime ?? {}) };
  const scoringEnv: Record<string, string> = {};
  for (const [k, v] of Object.entries(scoring.env ?? {})) {
    scoringEnv[k] = resolveTemplate(v, (n) => process.env[n]);
  }
  const spec = resolveRuntimeSpec(config, task, "grader", scoringEnv);
  if (spec.type === "subprocess" || (spec.type === "ssh" && !spec.dedicated)) {
    throw new ConfigError(
      `gradeSubmission needs a fresh, isolated grading sandbox; a ${spec.type} runtime is not ` +
        `one (task "${task.key}"); use docker or prime for scoring.runtime`,
    );
  }
  requireHostNotKept(spec, ctx.runtime, task, "scoring.runtime");
  // Collected while the grader starts and runs the task's setup (see gradeIsolated).
  const artifacts = collectArtifacts(ctx.runtime, task).then((collected) => {
    ctx.trace.artifacts = collected;
    return collected;
  });
  artifacts.catch(() => {}); // gradeIsolated awaits it and throws its failure
  const runId = ctx.runId ?? "validate";
  const trace = { scoring: { mode: "isolated", attempts: 0 } } as TaskTrace;
  return await gradeIsolated(
    spec,
    artifacts,
    scoring.retries ?? 2,
    { task, runId, policy: { runtime: config, sandboxes: ctx.sandboxes } } as TaskRolloutOptions,
    trace,
    (runtime, s) => ({ ...ctx, runtime, signal: s }),
    task.data.timeout?.scoring,
    signal,
  );
}

/**
 * A grader on a dedicated ssh host waits until the sandbox holding the host has stopped. When
 * that sandbox is `kept`, which stays up until grading is done, the wait would never end:
 * refuse it at once.
 * @throws {ConfigError}
 */
function requireHostNotKept(spec: RuntimeSpec, kept: Runtime, task: Task, field: string): void {
  if (spec.type !== "ssh" || !spec.dedicated) return;
  const holder = dedicatedHolderOf(spec);
  if (holder === undefined || holder !== kept.id) return;
  throw new ConfigError(
    `The grading sandbox of task "${task.key}" would need dedicated ssh host "${spec.host}", ` +
      `which sandbox "${holder}" holds until grading is done; a dedicated host holds one ` +
      `sandbox at a time: give ${field} a host of its own (host = "...")`,
  );
}

/**
 * Add the judges' rewards to a task's scores: every judge reads the trace (concurrently),
 * each reward weighted by its judge's weight; a judge that fails fails the scoring.
 */
async function judgeScores(
  scores: TaskScores,
  judges: Judge[],
  data: TaskData,
  view: TraceView,
  signal: AbortSignal,
): Promise<TaskScores> {
  const metrics: Record<string, number> = {};
  const judged = { info: view.info, messages: view.messages, metrics };
  const results = await Promise.all(judges.map((j) => j.score(data, judged, signal)));
  const out: TaskScores = {
    reward: scores.reward,
    rewards: { ...scores.rewards },
    metrics: { ...scores.metrics, ...metrics },
    weights: { ...(scores.weights ?? {}) },
  };
  judges.forEach((judge, i) => {
    const r = results[i];
    for (
      const [name, value] of typeof r === "number" ? [[judge.name, r] as const] : Object.entries(r)
    ) {
      if (!Number.isFinite(value)) throw new TypeError(`Judge "${judge.name}" returned ${value}`);
      out.rewards[name] = value;
      out.weights![name] = judge.weight;
      out.reward += value * judge.weight;
    }
  });
  return out;
}

/** A runtime for offline rescoring: there is no sandbox, so every use fails clearly. */
function noSandbox(task: Task): Runtime {
  const fail = () =>
    Promise.reject(
      new SandboxUnavailableError(
        `Offline rescoring of task "${task.key}" has no sandbox; mark only hooks that read the ` +
          `trace with { offline: true }`,
      ),
    );
  return {
    type: "offline",
    id: "",
    capabilities: {} as Runtime["capabilities"],
    start: fail,
    run: fail,
    read: fail,
    write: fail,
    archiveOut: fail,
    archiveIn: fail,
    stop: () => Promise.resolve(),
    [Symbol.asyncDispose]: () => Promise.resolve(),
  };
}

/**
 * Score a saved trace again without a sandbox: the task's hooks marked `offline` (they read
 * only the trace) and the judges run; the others are skipped, named in `skipped` and in a
 * warning. A task with its own `score()` is skipped whole (it may need the sandbox). When no
 * reward and no judge could run, `reward` is null: nothing was scored, so there is no 0.
 */
export async function rescoreTrace(
  task: Task,
  record: TaskTrace,
  options: { judges?: Judge[]; signal?: AbortSignal } = {},
): Promise<{
  scores: Omit<TaskScores, "reward"> & { reward: number | null };
  skipped: string[];
  info: Record<string, unknown>;
}> {
  const info = structuredClone(record.info ?? {});
  delete info.judge; // the new judges' replies only, so judge usage is not counted twice
  const view: TraceView = {
    info,
    messages: record.messages,
    artifacts: new Map(),
  };
  const ctx: TaskHookContext = {
    runtime: noSandbox(task),
    task,
    data: task.data,
    trace: view,
    state: task.initialState(),
    runId: record.run_id,
    signal: options.signal,
  };
  let scores: TaskScores;
  let skipped: string[];
  if (task.score !== Task.prototype.score) {
    scores = { reward: 0, rewards: {}, metrics: {}, weights: {} };
    skipped = ["score()"];
  } else {
    const result = await task.score(ctx, { offline: true });
    skipped = result.skipped ?? [];
    delete result.skipped;
    scores = result;
  }
  if (skipped.length) {
    console.warn(
      `Rescoring task "${task.key}" offline skipped ${
        skipped.map((s) => `"${s}"`).join(", ")
      }: they need a live sandbox (mark hooks that read only the trace with { offline: true })`,
    );
  }
  if (options.judges?.length) {
    scores = await judgeScores(
      scores,
      options.judges,
      task.data,
      view,
      options.signal ?? new AbortController().signal,
    );
  }
  const scored = Object.keys(scores.rewards).length > 0;
  return { scores: { ...scores, reward: scored ? scores.reward : null }, skipped, info: view.info };
}

/** Run one task rollout and return its trace (errors are recorded on it, never thrown). */
export async function runTaskRollout(options: TaskRolloutOptions): Promise<TaskTrace> {
  const rollout = new TaskRollout(options);
  try {
    if (await rollout.open()) await rollout.step();
    return await rollout.close();
  } finally {
    await rollout.dispose();
  }
}

/** Sandbox failures worth a fresh sandbox: it could not be created, reached or made ready. */
function isSandboxInfra(error: unknown): boolean {
  return error instanceof SandboxError && !(
    error instanceof SandboxFileNotFoundError || error instanceof SandboxFileTooLargeError ||
    error instanceof SandboxImageError || error instanceof SandboxUnsupportedError
  );
}

/**
 * A started sandbox from the policy's source, else created and started here. `hold` gets it
 * as soon as the caller may use it, so the caller stops it whatever happens next; one that
 * arrives after the phase ended is stopped here.
 */
/** The policy with sandboxes started for the caller only (see `AcquireOptions.unpooled`). */
function unpooled(policy: AgentPolicy): AgentPolicy {
  const source = policy.sandboxes;
  if (!source) return policy;
  return {
    ...policy,
    sandboxes: {
      acquire: (spec, options) => source.acquire(spec, { ...options, unpooled: true }),
      close: () => Promise.resolve(),
      ...(source.reserve ? { reserve: source.reserve.bind(source) } : {}),
    },
  };
}

async function startSandbox(
  policy: AgentPolicy,
  spec: RuntimeSpec,
  role: "agent" | "grader",
  options: TaskRolloutOptions,
  signal: AbortSignal,
  hold: (runtime: Runtime) => void,
  records?: SandboxRecord[],
  /** Its live slot, taken with its enclosure's (see `Enclosure.open`). */
  slot?: SandboxSlot,
  /** Told when it starts and stops waiting for a live slot (`AcquireOptions.onQueue`). */
  onQueue?: (waiting: boolean) => void,
): Promise<Runtime> {
  const labels = { runId: options.runId, task: options.task.key };
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
    hold(wrapped);
    return wrapped;
  };
  if (!policy.sandboxes) {
    slot?.release();
    const runtime = createRuntime(spec, labels);
    hold(runtime);
    await runtime.start({ signal, onQueue });
    return recorded(runtime);
  }
  let runtime: Runtime;
  try {
    runtime = await policy.sandboxes.acquire(spec, {
      ...labels,
      role,
      rollout: options.rolloutIndex ?? 0,
      // A sandbox on a rollout's own network is made for it, never pooled; it starts on the
      // slot taken with its enclosure's, so it counts against [limits] with its services.
      ...(spec.type === "docker" && spec.networkName ? { unpooled: true, slot } : {}),
      ...(slot ? {} : { onQueue }),
      signal,
    });
  } catch (error) {
    // Never handed to a sandbox (refused at once), or its sandbox is already removed.
    slot?.release();
    throw error;
  }
  if (signal.aborted) {
    // The phase is over (timeout, interrupt): nobody will use or stop this one.
    await runtime.stop().catch(() => {});
    throw signal.reason;
  }
  hold(runtime);
  return recorded(runtime);
}

async function gradeIsolated(
  spec: RuntimeSpec,
  /** Still being collected: the first grader starts and runs the task's setup meanwhile. */
  artifacts: Promise<Map<string, Uint8Array | null>>,
  retries: number,
  options: TaskRolloutOptions,
  trace: TaskTrace,
  hookContext: (runtime: Runtime, signal: AbortSignal) => TaskHookContext,
  timeoutSeconds: number | undefined,
  signal: AbortSignal | undefined,
  surround: {
    /** The grader's network policy, and where its refusals go. */
    egress?: { policy: NetworkPolicy; denied: EgressDenial[] };
    /** Services started fresh for each grading sandbox. */
    services: ServicesSpec | null;
    /** Where the grading sandboxes' operations are recorded. */
    records?: SandboxRecord[];
    /** Takes a grader's removal off the critical path: whoever passes it awaits it later. */
    defer?: (removal: Promise<void>) => void;
  } = { services: null },
): Promise<TaskScores> {
  const task = options.task;
  const records = surround.records;
  // Waiting for the artifacts does not count against the scoring timeout, and a failure to
  // collect them ends grading with that failure (it is not the grader's, so no retry).
  const cancel = new AbortController();
  let collected: Map<string, Uint8Array | null> | null = null;
  let uncollected: { error: unknown } | null = null;
  const arrived = artifacts.then(
    (map) => void (collected = map),
    (error) => {
      uncollected = { error };
      cancel.abort(error);
    },
  );
  const outer = signal ? AbortSignal.any([signal, cancel.signal]) : cancel.signal;
  let outcome: { scores: TaskScores } | { error: unknown };
  try {
    outcome = { scores: await attempts() };
  } catch (error) {
    outcome = { error };
  }
  // However grading ended, the collection is over before the caller goes on (it may remove
  // the agent's sandbox next), and its failure outranks the grader's.
  await arrived;
  if (uncollected) throw (uncollected as { error: unknown }).error;
  if ("error" in outcome) throw outcome.error;
  return outcome.scores;

  async function attempts(): Promise<TaskScores> {
    let last: unknown;
    for (let attempt = 0; attempt <= retries; attempt++) {
      trace.scoring.attempts = attempt + 1;
      // A failed attempt's grading sandbox is not what a replay should serve.
      const mark = records?.length ?? 0;
      let grader = null as Runtime | null;
      let enclosure = null as Enclosure | null;
      const hold = (rt: Runtime) => void (grader = rt);
      /** Phase 1's own work, which goes on for a while when the phase is cut short. */
      let running: Promise<unknown> = Promise.resolve();
      try {
        let started = performance.now();
        await phase(
          "scoring",
          timeoutSeconds,
          outer,
          async (s, queued) => {
            // Waiting for a sandbox slot under [limits] is not grading taking too long.
            const onQueue = (waiting: boolean) => {
              if (!waiting) started = performance.now();
              queued(waiting);
            };
            let graderSpec = spec;
            let graderSlot: SandboxSlot | undefined;
            const needs = {
              runId: options.runId,
              task: task.key,
              model: options.model,
              services: surround.services,
              gateway: false,
              egress: surround.egress !== undefined,
              alias: "grader",
              healthTimeout: timeoutSeconds,
              signal: s,
              onQueue,
            };
            if (Enclosure.needed(needs)) {
              // Fresh services, and a network out only through the proxy: setup, the restore and
              // stageVerifier are unrestricted, the rewards run under the grader's policy.
              const opened = await Enclosure.open(spec, needs, options.policy.sandboxes);
              graderSlot = opened.slot;
              if (s.aborted) {
                // The attempt is over (timeout, a failed collection): nobody else will close it.
                graderSlot?.release();
                await opened.enclosure.close().catch(() => {});
                throw s.reason;
              }
              enclosure = opened.enclosure;
              graderSpec = opened.spec;
            }
            await startSandbox(
              options.policy,
              graderSpec,
              "grader",
              options,
              s,
              hold,
              records,
              graderSlot,
              onQueue,
            );
            s.throwIfAborted();
            await task.setup(hookContext(grader!, s));
          },
          timeoutSeconds,
          (work) => (running = work),
        );
        const spent = (performance.now() - started) / 1000;
        await arrived;
        if (uncollected) throw (uncollected as { error: unknown }).error;
        // What is left of the attempt's timeout, the wait for the artifacts not counted.
        const left = timeoutSeconds && timeoutSeconds > 0
          ? Math.max(timeoutSeconds - spent, 0.001)
          : undefined;
        return await phase("scoring", left, outer, async (s) => {
          const ctx = hookContext(grader!, s);
          await restoreArtifacts(grader!, collected!);
          await task.stageVerifier(ctx);
          if (surround.egress) enclosure?.route?.session.setPhase("grade", surround.egress.policy);
          return await task.score(ctx);
        }, timeoutSeconds);
      } catch (error) {
        if (uncollected) throw (uncollected as { error: unknown }).error;
        // A fresh sandbox cannot mend a configuration (a limit too small for the grader).
        if (signal?.aborted || error instanceof ConfigError) throw error;
        last = error;
        if (records) records.length = mark;
      } finally {
        // The grader as known now, then again once phase 1's work has settled: a phase cut
        // short (a timeout, a failed collection) may still be starting one.
        // (A hook that ignores its signal and never settles is waited for 30 s, not forever.)
        const stopGrader = () => (grader as Runtime | null)?.stop().catch(() => {});
        const settled = settledWithin(running, 30_000);
        const removal = Promise.all([stopGrader(), settled.then(stopGrader)]).then(() => {});
        if (enclosure || !surround.defer) {
          // An enclosure's network goes only once its sandboxes have.
          await removal;
          const denied = await (enclosure as Enclosure | null)?.close() ?? [];
          surround.egress?.denied.push(...denied);
        } else surround.defer(removal);
      }
    }
    throw new InfraError(
      `Grading failed in ${retries + 1} fresh sandbox${retries ? "es" : ""}: ${
        last instanceof Error ? last.message : String(last)
      }`,
      { cause: last },
    );
  }
}
