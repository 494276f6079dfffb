/**
 * What one rollout holds while it runs, shared by its phases: the trace being written, the
 * agent's sandbox and what surrounds it (its enclosure: network, services, gateway), its
 * toolbox, the fork group it leads or joins, and the sandboxes still being removed.
 * @module
 */
import type { SandboxSlot } from "../../../runtimes/limits.ts";
import type { Runtime, RuntimeSpec } from "../../../runtimes/runtime.ts";
import type { EgressDenial, GatewayRoute } from "../../gateway/gateway.ts";
import { CLOSED_POLICY, type NetworkPolicy, parseNetworkPolicy } from "../../gateway/policy.ts";
import { ComposeCache, type LoadedServices } from "../../services/cache.ts";
import type { Toolbox, ToolboxRecord } from "../../tools/toolbox.ts";
import { Enclosure } from "../enclosure.ts";
import type { ForkLead, ForkMember } from "../fork.ts";
import { MessageGraph } from "../../graph.ts";
import type { HarnessRecorder } from "../harness.ts";
import type { SandboxRecord } from "../record.ts";
import type { ScoringConfig, StopHook, TaskHookContext, TaskTimeouts, TraceView } from "../task.ts";
import { type TaskTrace, TRACE_FORMAT_VERSION } from "../trace.ts";
import type { Messages } from "../../types.ts";
import type { TaskRolloutOptions } from "./options.ts";
import { warnOnce } from "./_warn.ts";

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

const TOKEN_LIMIT_STOPS = new Set(["max_input_tokens", "max_output_tokens", "max_total_tokens"]);

/** Whether a segment ended on a stop: its turn limit, a token limit or one of the task's hooks. */
export function stoppedBy(condition: string | null | undefined, hooks: StopHook[]): boolean {
  return condition === "max_turns_reached" || TOKEN_LIMIT_STOPS.has(condition ?? "") ||
    hooks.some((h) => h.name === condition);
}

/** One rollout's state, as its phases read and change it (see the module doc). */
export class RolloutState {
  readonly options: TaskRolloutOptions;
  readonly trace: TaskTrace;
  readonly view: TraceView;
  /** This rollout's own state, shared by the task's hooks, its rewards and the harness. */
  readonly state: Record<string, unknown>;
  readonly recorder: HarnessRecorder;
  readonly scoring: ScoringConfig;
  readonly mode: "shared" | "isolated";
  readonly t0 = performance.now();
  /** Every sandbox's operations, in order (what `record.jsonl` keeps for vf replay). */
  readonly records: SandboxRecord[] = [];
  toolRecord: ToolboxRecord | null = null;
  agentSpec: RuntimeSpec | null = null;
  agent: Runtime | null = null;
  toolbox: Toolbox | null = null;
  /** The agent phase's egress policy (null: the network as the runtime has it). */
  egress: NetworkPolicy | null = null;
  enclosure: Enclosure | null = null;
  gateway: GatewayRoute | null = null;
  /** The live slot the agent's sandbox starts on, taken with its enclosure's. */
  agentSlot: SandboxSlot | undefined;
  /** The fork group this rollout leads, until it has settled it. */
  leading: ForkLead | null = null;
  /** The fork group whose snapshot this rollout's sandbox runs from, until it is removed. */
  forkMember: ForkMember | null = null;
  /** The agent sandbox's removal when it was started off the critical path. */
  agentStopping: Promise<void> | undefined;
  /** Grading sandboxes' removals, started as soon as their scores were in. */
  readonly graderStopping: Promise<void>[] = [];
  #composeCache: ComposeCache | undefined;

  constructor(options: TaskRolloutOptions) {
    this.options = options;
    const { task, policy } = options;
    const data = task.data;
    const scoring: ScoringConfig = { ...(data.scoring ?? {}), ...(policy.scoring ?? {}) };
    if (data.scoring?.env || policy.scoring?.env) {
      scoring.env = { ...(data.scoring?.env ?? {}), ...(policy.scoring?.env ?? {}) };
    }
    this.scoring = scoring;
    this.mode = scoring.mode ?? "shared";
    if (this.mode === "shared" && scoring.env && Object.keys(scoring.env).length > 0) {
      warnOnce(
        "scoring.env applies to the isolated grading sandbox only; it is ignored in shared scoring mode",
      );
    }
    this.recorder = {
      messages: [],
      model_calls: [],
      tool_calls: [],
      stop_condition: null,
      usage: { input_tokens: 0, output_tokens: 0 },
      metrics: {},
      graph: new MessageGraph(),
    };
    this.state = options.state ?? task.initialState();
    this.view = { info: {}, messages: this.recorder.messages, artifacts: new Map() };
    const runtimeType = options.box ? options.box.spec.type : policy.runtime.type ?? "docker";
    this.trace = {
      format_version: TRACE_FORMAT_VERSION,
      trace_id: crypto.randomUUID().replaceAll("-", ""), // 32 hex digits, as upstream's Trace ids
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
      scoring: { mode: this.mode, attempts: 0 },
      messages: this.recorder.messages,
      model_calls: this.recorder.model_calls,
      tool_calls: this.recorder.tool_calls,
      stop_condition: null,
      reward: null,
      rewards: {},
      metrics: {},
      ok: false,
      error: null,
      usage: this.recorder.usage,
      timing: { started_at: Date.now() / 1000 },
      info: this.view.info,
    };
  }

  /** The rollout's state as a task hook sees it. */
  ctx(runtime: Runtime, signal?: AbortSignal): TaskHookContext {
    const { task, runId } = this.options;
    return {
      runtime,
      task,
      data: task.data,
      trace: this.view,
      state: this.state,
      runId,
      tools: this.toolbox ?? undefined,
      signal,
    };
  }

  /** A phase's limit in seconds: the policy's, else the task's own. */
  timeout(stage: keyof TaskTimeouts): number | undefined {
    return this.options.policy.timeouts?.[stage] ?? this.options.task.data.timeout?.[stage];
  }

  /** Run `fn`, writing how long it took to the trace's `timing[<key>_ms]` however it ends. */
  async timed<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.trace.timing[`${key}_ms`] = Math.round(performance.now() - t0);
    }
  }

  /** The Compose file of the task's services (its own, else the run's), or null. */
  get compose(): string | Record<string, unknown> | null {
    return this.options.task.deploymentSpec() ?? this.options.services ?? null;
  }

  /** The task's services, parsed once per run (the run's cache, else this rollout's); null: none. */
  services(): Promise<LoadedServices | null> {
    const compose = this.compose;
    if (compose === null) return Promise.resolve(null);
    this.#composeCache ??= this.options.composeCache ?? new ComposeCache();
    return this.#composeCache.load(compose);
  }

  /** Stop the agent's sandbox if this rollout owns it and still holds it, then its enclosure. */
  async stopAgent(): Promise<void> {
    const agent = this.agent;
    this.agent = null;
    let removed = true;
    if (agent && agent !== this.options.box?.runtime) {
      await agent.stop().catch(() => (removed = false));
    }
    // A snapshot deleted while a container still runs from it is only untagged and left
    // behind: a member whose sandbox could not be removed keeps it until the run ends.
    const member = this.forkMember;
    this.forkMember = null;
    if (removed) member?.released();
    await this.releaseNetwork();
  }

  /** The grader's egress policy: `scoring.network`, else the agent's. */
  graderPolicy(): NetworkPolicy {
    const own = this.scoring.network;
    return own ? parseNetworkPolicy(own, "scoring.network") : this.egress ?? CLOSED_POLICY;
  }

  /**
   * Give the agent's sandbox what it needs around it (its {@link Enclosure}): a network of its
   * own with the task's services, the gateway relay for an agent program or a network policy.
   * Returns the sandbox's spec joined to it.
   */
  async prepareNetwork(
    spec: RuntimeSpec,
    options: { signal: AbortSignal; onQueue?: (waiting: boolean) => void },
  ): Promise<RuntimeSpec> {
    const { task, policy, runId, model } = this.options;
    const { signal, onQueue } = options;
    const needs = {
      runId,
      task: task.key,
      model,
      services: await this.services(),
      gateway: policy.harness.needsGateway === true,
      egress: this.egress !== null,
      alias: "agent",
      healthTimeout: this.timeout("setup"),
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
        this.enclosure = opened.enclosure;
        this.gateway = opened.enclosure.route;
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
    this.enclosure = opened.enclosure;
    this.gateway = opened.enclosure.route;
    this.agentSlot = opened.slot;
    return opened.spec;
  }

  /** Seal the gateway session (its refusals go on the trace), stop services and network. */
  async releaseNetwork(): Promise<void> {
    const enclosure = this.enclosure;
    this.enclosure = null;
    this.gateway = null;
    const denied = await enclosure?.close() ?? [];
    if (this.egress || denied.length) this.recordDenials(denied);
  }

  /** Put refused connections on the trace, under the agent phase's policy. */
  recordDenials(denied: EgressDenial[]): void {
    this.trace.network = {
      policy: this.trace.network?.policy ?? this.egress ?? CLOSED_POLICY,
      denied: [...(this.trace.network?.denied ?? []), ...denied],
    };
  }
}
