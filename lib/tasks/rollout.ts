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
import { createRuntime } from "../../runtimes/create.ts";
import type { Runtime, RuntimeSpec } from "../../runtimes/runtime.ts";
import { excludeMatcher, packTar, readTar, type TarEntry } from "../../runtimes/_tar.ts";
import type { ChatClient } from "../model/client.ts";
import { resolveTemplate } from "../config.ts";
import {
  ConfigError,
  InfraError,
  ModelError,
  SandboxError,
  type SerializedError,
  serializeError,
  TaskError,
} from "../errors.ts";
import type { Harness, HarnessRecorder, ModelCallRecord, ToolCallRecord } from "./harness.ts";
import {
  type Artifact,
  DEFAULT_ARTIFACT_MAX_BYTES,
  type RuntimeConfig,
  type ScoringConfig,
  type Task,
  type TaskHookContext,
  type TaskScores,
  type TraceView,
} from "./task.ts";
import type { Messages, SamplingArgs } from "../types.ts";

/** Version of trace records. */
export const TRACE_FORMAT_VERSION = 1;

/** How the agent runs and where it is graded (from `[env.agent]`). */
export interface AgentPolicy {
  runtime: RuntimeConfig;
  harness: Harness;
  /** Overrides merged over each task's `scoring`. */
  scoring?: ScoringConfig;
  maxTurns?: number;
  toolTimeoutSeconds?: number;
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
  /**
   * `attempts`: agent sandboxes tried when more than one was needed (infrastructure failures
   * retry in a fresh sandbox); absent means the first one worked.
   */
  runtime: { type: string; image?: string; attempts?: number };
  scoring: { mode: "shared" | "isolated"; attempts: number };
  messages: Messages;
  model_calls: ModelCallRecord[];
  /** Model requests of this rollout that were retried (set when the trace is written). */
  model_retries?: number;
  tool_calls: ToolCallRecord[];
  stop_condition: string | null;
  reward: number | null;
  rewards: Record<string, number>;
  metrics: Record<string, number>;
  ok: boolean;
  /** `infra`: the failure was infrastructure (sandbox, engine), not the agent's or the task's. */
  error: (SerializedError & { phase: string; infra?: boolean }) | null;
  usage: { input_tokens: number; output_tokens: number };
  timing: Record<string, number>;
  info: Record<string, unknown>;
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
  if (type !== "docker") {
    throw new ConfigError(
      `Unknown runtime type "${type}"; known: "docker", "subprocess", "ssh", "prime"`,
    );
  }
  const image = config.image ?? data.image;
  if (!image) {
    throw new ConfigError(
      `Task "${task.key}" has no image for its ${role} sandbox; set TaskData.image or ` +
        `--env.agent.runtime.image`,
    );
  }
  return {
    type: "docker",
    image,
    cpu: config.cpu ?? data.resources?.cpu,
    memory: memoryString(config.memory ?? data.resources?.memory),
    workdir: config.workdir ?? data.workdir,
    env,
    network: config.network ?? data.network ?? false,
    labels: { "vf.role": role },
  };
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

/** Race a phase against its timeout (seconds) and the run's signal. */
async function phase<T>(
  name: string,
  seconds: number | undefined,
  signal: AbortSignal | undefined,
  fn: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  const controller = new AbortController();
  const signals = [controller.signal, ...(signal ? [signal] : [])];
  if (seconds && seconds > 0) signals.push(AbortSignal.timeout(seconds * 1000));
  const combined = AbortSignal.any(signals);
  return await new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      const reason = combined.reason;
      reject(
        reason instanceof DOMException && reason.name === "TimeoutError"
          ? new TaskError(`Phase "${name}" timed out after ${seconds}s`, { cause: reason })
          : reason,
      );
    };
    if (combined.aborted) return onAbort();
    combined.addEventListener("abort", onAbort, { once: true });
    fn(combined).then(resolve, reject).finally(() =>
      combined.removeEventListener("abort", onAbort)
    );
  }).finally(() => controller.abort());
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

/** Restore artifacts into a sandbox, replacing whatever is at those paths. */
export async function restoreArtifacts(
  runtime: Runtime,
  artifacts: Map<string, Uint8Array | null>,
): Promise<void> {
  for (const [path, tar] of artifacts) {
    if (!tar) continue;
    const rm = await runtime.run(["rm", "-rf", path]);
    if (rm.exit_code !== 0) {
      throw new SandboxError(`Cannot clear "${path}" before restoring: ${rm.stderr}`);
    }
    await runtime.archiveIn(posix.dirname(path), tar);
  }
}

/** Run one task rollout and return its trace (errors are recorded on it, never thrown). */
export async function runTaskRollout(options: TaskRolloutOptions): Promise<TaskTrace> {
  const { task, policy, signal } = options;
  const data = task.data;
  const envLookup = options.env ?? ((n: string) => process.env[n]);
  const scoring: ScoringConfig = { ...(data.scoring ?? {}), ...(policy.scoring ?? {}) };
  if (data.scoring?.env || policy.scoring?.env) {
    scoring.env = { ...(data.scoring?.env ?? {}), ...(policy.scoring?.env ?? {}) };
  }
  const mode = scoring.mode ?? "shared";
  if (mode === "shared" && scoring.env && Object.keys(scoring.env).length > 0) {
    warnOnce(
      "scoring.env applies to the isolated grading sandbox only; it is ignored in shared scoring mode",
    );
  }
  const recorder: HarnessRecorder = {
    messages: [],
    model_calls: [],
    tool_calls: [],
    stop_condition: null,
    usage: { input_tokens: 0, output_tokens: 0 },
  };
  const view: TraceView = { info: {}, messages: recorder.messages, artifacts: new Map() };
  const timing: Record<string, number> = { started_at: Date.now() / 1000 };
  const trace: TaskTrace = {
    format_version: TRACE_FORMAT_VERSION,
    trace_id: crypto.randomUUID(),
    run_id: options.runId,
    taskset: options.tasksetId,
    task: { key: task.key, idx: data.idx ?? 0, hash: task.hash },
    example_id: data.idx ?? 0,
    rollout_index: options.rolloutIndex ?? 0,
    model: options.model,
    harness: policy.harness.id,
    runtime: { type: policy.runtime.type ?? "docker", image: policy.runtime.image ?? data.image },
    scoring: { mode, attempts: 0 },
    messages: recorder.messages,
    model_calls: recorder.model_calls,
    tool_calls: recorder.tool_calls,
    stop_condition: null,
    reward: null,
    rewards: {},
    metrics: {},
    ok: false,
    error: null,
    usage: recorder.usage,
    timing,
    info: view.info,
  };
  const timed = async <T>(key: string, fn: () => Promise<T>): Promise<T> => {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      timing[`${key}_ms`] = Math.round(performance.now() - t0);
    }
  };
  const t0 = performance.now();
  let agent = null as Runtime | null;
  try {
    // deno-lint-ignore require-await
    const agentSpec = await inPhase("config", async () => {
      const spec = resolveRuntimeSpec(policy.runtime, task, "agent");
      if (mode === "isolated" && spec.type === "subprocess") {
        throw new ConfigError(
          `Isolated scoring needs a container runtime; the subprocess runtime cannot collect artifacts ` +
            `or start a grading sandbox (task "${task.key}"); use docker or --env.agent.scoring.mode shared`,
        );
      }
      if (policy.harness.executesCode && spec.type === "subprocess") {
        console.warn(
          `Harness "${policy.harness.id}" runs agent commands on the host (subprocess runtime)`,
        );
      }
      return spec;
    });
    const ctx = (runtime: Runtime, s?: AbortSignal): TaskHookContext => ({
      runtime,
      task,
      data,
      trace: view,
      signal: s,
    });
    const retries = policy.infraRetries ?? 2;
    await inPhase("setup", () =>
      timed("setup", async () => {
        for (let attempt = 0;; attempt++) {
          if (attempt > 0) trace.runtime.attempts = attempt + 1;
          let ready = false;
          try {
            await phase("setup", data.timeout?.setup, signal, async (s) => {
              const t1 = performance.now();
              await startSandbox(policy, agentSpec, "agent", options, s, (rt) => (agent = rt));
              ready = true;
              timing.sandbox_ms = Math.round(performance.now() - t1);
              await task.setup(ctx(agent!, s));
              if (data.agent_user) await grantAgentUser(agent!, task, data.agent_user);
            });
            return;
          } catch (raw) {
            let error = raw;
            if (!ready && raw instanceof TaskError && /timed out/.test(raw.message)) {
              error = new SandboxUnavailableError(
                `The agent sandbox did not become ready within the setup timeout ` +
                  `(${data.timeout?.setup}s)`,
                { cause: raw },
              );
            }
            const stale = agent;
            agent = null;
            await stale?.stop().catch(() => {});
            if (signal?.aborted || attempt >= retries || !isSandboxInfra(error)) throw error;
            // Back off before asking the backend again: 0.25 s, 0.5 s, 1 s, ... (max 5 s).
            await new Promise((r) => setTimeout(r, Math.min(5_000, 250 * 2 ** attempt)));
          }
        }
      }));
    await inPhase(
      "agent",
      () =>
        timed("agent", () =>
          phase("agent", data.timeout?.agent, signal, (s) =>
            policy.harness.run({
              task,
              data,
              runtime: agent!,
              client: options.client,
              model: options.model,
              samplingArgs: options.samplingArgs ?? {},
              recorder,
              maxTurns: policy.maxTurns ?? 30,
              toolTimeoutMs: (policy.toolTimeoutSeconds ?? 600) * 1000,
              user: data.agent_user,
              signal: s,
            }))),
    );
    trace.stop_condition = recorder.stop_condition;
    await inPhase(
      "finalize",
      () =>
        timed(
          "finalize",
          () =>
            phase("finalize", data.timeout?.finalize, signal, async (s) =>
              await task.finalize(ctx(agent!, s))),
        ),
    );

    let scores: TaskScores;
    if (mode === "shared") {
      trace.scoring.attempts = 1;
      scores = await inPhase(
        "scoring",
        () =>
          timed("scoring", () =>
            phase("scoring", data.timeout?.scoring, signal, async (s) => {
              // The agent is done: private tests may be staged in its sandbox now.
              await task.stageVerifier(ctx(agent!, s));
              return await task.score(ctx(agent!, s));
            })),
      );
    } else {
      const artifacts = await inPhase(
        "artifacts",
        () => timed("artifacts", () => collectArtifacts(agent!, task)),
      );
      view.artifacts = artifacts;
      await agent!.stop();
      agent = null;
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
              `${
                spec.type === "ssh" ? " on a shared host" : ""
              } is not one (task "${task.key}"); ` +
              `use docker or prime for --env.agent.scoring.runtime`,
          );
        }
        const agentWorkdir = agentSpec.workdir ?? data.workdir;
        const relative = (data.artifacts ?? []).find((a) => !posix.isAbsolute(a.source));
        if (relative && spec.workdir !== agentWorkdir) {
          throw new ConfigError(
            `Relative artifact path "${relative.source}" requires the agent and grading sandboxes to ` +
              `share a workdir ("${agentWorkdir}" vs "${spec.workdir}"); use an absolute path`,
          );
        }
        return spec;
      });
      scores = await inPhase(
        "scoring",
        () =>
          timed("scoring", () =>
            gradeIsolated(
              task,
              graderSpec,
              artifacts,
              scoring.retries ?? 2,
              options,
              trace,
              view,
              signal,
            )),
      );
    }
    trace.reward = scores.reward;
    trace.rewards = scores.rewards;
    trace.metrics = scores.metrics;
    trace.ok = true;
  } catch (raw) {
    const phaseName = raw instanceof PhaseError ? raw.phase : "rollout";
    const error = raw instanceof PhaseError ? raw.error : raw;
    if (signal?.aborted) throw signal.reason; // interrupted: not a result, nothing to record
    trace.error = { ...serializeError(error), phase: phaseName };
    // The model endpoint failing after its retries is infrastructure too (a bad key ends the run).
    if (error instanceof InfraError || error instanceof ModelError) trace.error.infra = true;
    trace.stop_condition ??= recorder.stop_condition ?? "has_error";
  } finally {
    if (agent) await agent.stop().catch(() => {});
    timing.total_ms = Math.round(performance.now() - t0);
  }
  return trace;
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
async function startSandbox(
  policy: AgentPolicy,
  spec: RuntimeSpec,
  role: "agent" | "grader",
  options: TaskRolloutOptions,
  signal: AbortSignal,
  hold: (runtime: Runtime) => void,
): Promise<Runtime> {
  const labels = { runId: options.runId, task: options.task.key };
  if (!policy.sandboxes) {
    const runtime = createRuntime(spec, labels);
    hold(runtime);
    await runtime.start({ signal });
    return runtime;
  }
  const runtime = await policy.sandboxes.acquire(spec, { ...labels, role, signal });
  if (signal.aborted) {
    // The phase is over (timeout, interrupt): nobody will use or stop this one.
    await runtime.stop().catch(() => {});
    throw signal.reason;
  }
  hold(runtime);
  return runtime;
}

async function gradeIsolated(
  task: Task,
  spec: RuntimeSpec,
  artifacts: Map<string, Uint8Array | null>,
  retries: number,
  options: TaskRolloutOptions,
  trace: TaskTrace,
  view: TraceView,
  signal: AbortSignal | undefined,
): Promise<TaskScores> {
  let last: unknown;
  for (let attempt = 0; attempt <= retries; attempt++) {
    trace.scoring.attempts = attempt + 1;
    let grader = null as Runtime | null;
    try {
      return await phase("scoring", task.data.timeout?.scoring, signal, async (s) => {
        await startSandbox(options.policy, spec, "grader", options, s, (rt) => (grader = rt));
        const ctx: TaskHookContext = {
          runtime: grader!,
          task,
          data: task.data,
          trace: view,
          signal: s,
        };
        await task.setup(ctx);
        await restoreArtifacts(grader!, artifacts);
        await task.stageVerifier(ctx);
        return await task.score(ctx);
      });
    } catch (error) {
      if (signal?.aborted) throw error;
      last = error;
    } finally {
      await grader?.stop().catch(() => {});
    }
  }
  throw new InfraError(
    `Grading failed in ${retries + 1} fresh sandbox${retries ? "es" : ""}: ${
      last instanceof Error ? last.message : String(last)
    }`,
    { cause: last },
  );
}
