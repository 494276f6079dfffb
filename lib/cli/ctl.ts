/**
 * `vf ctl [run_id] status|pause [--now]|resume|requeue|set KEY=N...|concurrency N|list`: steers
 * a running `vf eval` or `vf run` through its control socket (lib/eval/control.ts). With one
 * run live, no id is needed.
 * @module
 */

import { readFile } from "node:fs/promises";
import { connect } from "node:net";
import { join } from "node:path";
import process from "node:process";
import type { SandboxLimits } from "../../runtimes/limits.ts";
import type { Semaphore } from "../model/limits.ts";
import type { Env, Episode } from "../agents/env.ts";
import { requireIsolatableConcurrency, scoredTraces } from "../agents/run.ts";
import { ConfigError, describeError } from "../errors.ts";
import {
  controlDir,
  type ControlRequest,
  listControlSockets,
  RunControl,
  serveControl,
} from "../eval/control.ts";
import { writeJsonAtomic } from "../eval/results.ts";
import type { CostBudget, CostMeter } from "../model/cost.ts";
import { terminalJson, terminalLines, terminalText } from "../util/terminal.ts";
import { costRecord } from "./resolve.ts";

const USAGE = `usage: vf ctl [RUN_ID] ACTION
  list               runs with a control socket
  status             in flight, queued, done, errors, rate, spend and stalls (the default)
  status --stall N   list the rollouts with no progress for N s (default 60), with what
                     they last did: vf eval's by example and rollout index, a taskset
                     run's by task and rollout index
  status --json      the status as one JSON object (control characters escaped)
  pause              start no more rollouts; those in flight finish
  pause --now        also interrupt those in flight: back to the queue, run again on resume
  resume             start rollouts again
  requeue            run the errored rollouts again; their retry replaces them in the results
  set KEY=N ...      change max_concurrent, and for a taskset run the sandbox limits
                     (max_sandboxes, sandbox_create_rate) and the timeouts (timeout.agent,
                     timeout.setup, timeout.scoring, timeout.finalize, timeout.episode),
                     the token budgets per rollout (max_input_tokens, max_output_tokens,
                     max_total_tokens) and, with [limits] max_model_connections, that limit;
                     status lists what the run takes
  concurrency N      the same as set max_concurrent=N
Sockets live in VF_CTL_DIR (default ~/.cache/vf/ctl), one per run, owner-only.
`;

/** Sends one request to a run's socket and returns its answer. */
export function askControl(
  path: string,
  request: ControlRequest,
  options: { timeoutMs?: number } = {},
): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    let data = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`No answer from "${path}" within ${options.timeoutMs ?? 10_000} ms`));
    }, options.timeoutMs ?? 10_000);
    socket.setEncoding("utf8");
    socket.on("connect", () => socket.write(JSON.stringify(request) + "\n"));
    socket.on("data", (chunk: string) => (data += chunk));
    socket.on("error", (error) => {
      clearTimeout(timer);
      reject(
        new ConfigError(
          `Cannot reach the run at "${path}": ${error.message}; is it still running? (vf ctl list)`,
        ),
      );
    });
    socket.on("end", () => {
      clearTimeout(timer);
      try {
        resolve(JSON.parse(data) as Record<string, unknown>);
      } catch {
        reject(new Error(`"${path}" answered with something that is not JSON`));
      }
    });
  });
}

function renderStatus(status: Record<string, unknown>): string {
  const s = status as Record<string, unknown> & { actions?: unknown[]; live?: unknown };
  const num = (v: unknown, digits = 0) =>
    typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "-";
  const lines = [
    `run ${terminalText(String(s.run_id))} (pid ${num(s.pid)})${s.paused ? " PAUSED" : ""}`,
    `  in flight ${num(s.in_flight)}  queued ${num(s.queued)}  done ${num(s.done)}/${
      num(s.total)
    }  errors ${num(s.errors)}  interrupted ${num(s.interrupted)}  requeued ${num(s.requeued)}`,
    `  avg reward ${num(s.avg_reward, 3)}  ${num(s.rollouts_per_s, 2)} rollouts/s  elapsed ${
      num(s.elapsed_s, 0)
    }s  max_concurrent ${num(s.max_concurrent)}`,
    s.stalled
      ? `  STALLED: no rollout finished for ${num(s.no_progress_s)}s (threshold ${
        num(s.stall_after_s)
      }s)`
      : `  no stall (threshold ${num(s.stall_after_s)}s)`,
  ];
  if (Array.isArray(s.stalled_rollouts)) {
    const stalled = s.stalled_rollouts as Array<Record<string, unknown>>;
    lines.push(
      `  ${stalled.length} of ${num(s.tracked)} rollouts in flight with no progress for ${
        num(s.stall_after_s)
      }s or more`,
    );
    for (const r of stalled.slice(0, 50)) {
      lines.push(
        `  stalled ${terminalText(String(r.id))}  last ${terminalText(String(r.last))}  idle ${
          num(r.idle_s)
        }s  running ${num(r.running_s)}s`,
      );
    }
    if (stalled.length > 50) lines.push(`  ... and ${stalled.length - 50} more`);
  }
  if (s.knobs && typeof s.knobs === "object") {
    const knobs = Object.entries(s.knobs as Record<string, unknown>)
      .map(([k, v]) => `${terminalText(k)}=${typeof v === "number" ? v : "-"}`);
    lines.push(`  settings ${knobs.join(" ")}`);
  }
  if (s.live && typeof s.live === "object") {
    lines.push(`  ${terminalText(JSON.stringify(s.live))}`);
  }
  const actions = Array.isArray(s.actions) ? s.actions : [];
  for (const a of actions.slice(-5)) lines.push(`  action ${terminalText(JSON.stringify(a))}`);
  return lines.join("\n");
}

/** `vf ctl`. */
export async function cmdCtl(argv: string[]): Promise<number> {
  if (argv.includes("-h") || argv.includes("--help")) {
    process.stdout.write(USAGE);
    return 0;
  }
  const dir = controlDir();
  const runs = await listControlSockets(dir);
  const actions = new Set(["list", "status", "pause", "resume", "requeue", "set", "concurrency"]);
  let [first, ...rest] = argv;
  let runId: string | undefined;
  if (first !== undefined && !actions.has(first)) {
    runId = first;
    [first, ...rest] = rest;
  }
  const action = first ?? "status";
  if (!actions.has(action)) {
    process.stderr.write(`error: unknown action "${terminalText(action)}"\n${USAGE}`);
    return 2;
  }
  if (action === "list") {
    process.stdout.write(runs.map((r) => terminalText(r) + "\n").join(""));
    return 0;
  }
  if (!runId) {
    if (runs.length !== 1) {
      process.stderr.write(
        runs.length === 0
          ? `error: no run has a control socket in "${terminalText(dir)}"\n`
          : `error: ${runs.length} runs are live (${
            runs.map(terminalText).join(", ")
          }); name one: vf ctl RUN_ID ${action}\n`,
      );
      return 1;
    }
    runId = runs[0];
  }
  if (!/^[\w.-]+$/.test(runId)) throw new ConfigError(`Bad run id "${terminalText(runId)}"`);
  let request: ControlRequest;
  let json = false;
  if (action === "concurrency") {
    const n = Number(rest[0]);
    if (!Number.isInteger(n) || n < 1) {
      process.stderr.write(`error: vf ctl concurrency needs a positive integer\n`);
      return 2;
    }
    request = { action: "set", values: { max_concurrent: n } };
  } else if (action === "set") {
    const values: Record<string, number> = {};
    for (const arg of rest) {
      const m = /^([\w.]+)=(.+)$/.exec(arg);
      const n = m ? Number(m[2]) : NaN;
      if (!m || !Number.isFinite(n)) {
        process.stderr.write(`error: vf ctl set takes KEY=NUMBER, got "${terminalText(arg)}"\n`);
        return 2;
      }
      values[m[1]] = n;
    }
    if (!rest.length) {
      process.stderr.write(`error: vf ctl set needs KEY=NUMBER (max_concurrent=8)\n`);
      return 2;
    }
    request = { action: "set", values };
  } else if (action === "pause") {
    const now = rest.includes("--now") || rest.includes("now");
    request = { action: "pause", mode: now ? "now" : "after" };
  } else if (action === "status") {
    json = rest.includes("--json");
    if (json) rest = rest.filter((a) => a !== "--json");
    const at = rest.indexOf("--stall");
    const raw = at >= 0 ? rest[at + 1] : rest.find((a) => a.startsWith("--stall="))?.slice(8);
    if (raw === undefined && (at >= 0 || rest.length)) {
      process.stderr.write(`error: vf ctl status takes --stall SECONDS\n`);
      return 2;
    }
    const stall = raw === undefined ? undefined : Number(raw);
    if (stall !== undefined && !(Number.isFinite(stall) && stall >= 0)) {
      process.stderr.write(
        `error: vf ctl status --stall needs seconds ≥ 0, got "${terminalText(String(raw))}"\n`,
      );
      return 2;
    }
    request = stall === undefined ? { action } : { action, stall };
  } else {
    request = { action } as ControlRequest;
  }
  const answer = await askControl(join(dir, `${runId}.sock`), request);
  if (answer.ok !== true) {
    process.stderr.write(`error: ${terminalText(String(answer.error))}\n`);
    return 1;
  }
  const status = answer.status as Record<string, unknown>;
  process.stdout.write((json ? terminalJson(status) : renderStatus(status)) + "\n");
  return 0;
}

/** Workers a steered taskset run starts, so `vf ctl set max_concurrent=N` can raise it to this. */
export const TASK_RUN_CEILING = 256;

/**
 * Puts a taskset run (`vf run`, `vf eval <taskset>`) under `vf ctl`: its control with the knobs
 * a taskset run has (`max_sandboxes` when `[limits]` set sandbox limits; `timeout.setup`,
 * `timeout.agent`, `timeout.scoring`, `timeout.finalize` of every role; `timeout.episode` of
 * the Env), served on its socket. `close()` ends the socket and records the control's state
 * and actions in the run's metadata.json.
 */
export async function controlTaskRun(options: {
  runId: string;
  runDir: string | null;
  maxConcurrent: number;
  env: Env;
  limits?: SandboxLimits;
  /** The model-connection permits of each endpoint (`[limits] max_model_connections`). */
  connections?: Semaphore[];
  /** The run's spend and budget, which status shows when the run has prices or a budget. */
  meter?: CostMeter;
  budget?: CostBudget | null;
  signal: AbortSignal;
}): Promise<
  { control: RunControl; episode: (e: Episode, total: number) => void; close: () => Promise<void> }
> {
  const roles = Object.values(options.env.roles);
  const { meter } = options;
  const control = new RunControl(options.runId, {
    maxConcurrent: options.maxConcurrent,
    live: meter
      ? () => {
        const cost = costRecord(meter, options.budget ?? null);
        return cost ? { cost } : undefined;
      }
      : undefined,
    // What the run was checked for before it started holds for a new limit too.
    checkConcurrency: (n) => {
      for (const role of roles) requireIsolatableConcurrency(role.policy, n, { role: role.name });
    },
  });
  /** The latest episode of each task and index: a requeued one replaces its errored one. */
  const latest = new Map<string, { failed: boolean; rewards: number[] }>();
  const episode = (e: Episode, total: number) => {
    const scored = scoredTraces([e]);
    latest.set(`${e.task.key}#${e.episode_index}`, {
      failed: scored.some((t) => t.error),
      rewards: scored.flatMap((t) => (t.error || t.reward === null ? [] : [t.reward])),
    });
    let errors = 0;
    let sum = 0;
    let n = 0;
    for (const l of latest.values()) {
      if (l.failed) errors++;
      for (const r of l.rewards) {
        sum += r;
        n++;
      }
    }
    control.progress({ done: latest.size, total, errors, avgReward: n ? sum / n : 0 });
  };
  const { env, limits } = options;
  if (limits) {
    control.knob("max_sandboxes", {
      get: () => limits.maxLive ?? null,
      set: (n) => limits.setMaxLive(n),
    });
    control.knob("sandbox_create_rate", {
      get: () => limits.createRate ?? null,
      set: (rate) => limits.setCreateRate(rate),
    });
  }
  for (const stage of ["setup", "agent", "scoring", "finalize"] as const) {
    control.knob(`timeout.${stage}`, {
      get: () => roles[0]?.policy.timeouts?.[stage] ?? null,
      // Rollouts read their role's policy as they start: those after this see the new limit.
      set: (seconds) => {
        for (const role of roles) {
          role.policy.timeouts = { ...role.policy.timeouts, [stage]: seconds };
        }
      },
    });
  }
  const connections = options.connections ?? [];
  if (connections.length) {
    control.knob("max_model_connections", {
      get: () => connections[0].max,
      // Calls waiting for a permit and those after see the new limit; open calls go on.
      set: (n) => {
        for (const c of connections) c.resize(n);
      },
    });
  }
  for (const name of ["max_input_tokens", "max_output_tokens", "max_total_tokens"] as const) {
    control.knob(name, {
      get: () => roles[0]?.policy.tokenLimits?.[name] ?? null,
      // A rollout takes its role's policy as its agent starts: those after this see it.
      set: (n) => {
        for (const role of roles) {
          role.policy.tokenLimits = { ...role.policy.tokenLimits, [name]: n };
        }
      },
    });
  }
  control.knob("timeout.episode", {
    get: () => (env.options.timeout as { episode?: number } | undefined)?.episode ?? null,
    set: (seconds) => {
      env.options.timeout = { ...(env.options.timeout as object | undefined), episode: seconds };
    },
  });
  options.signal.addEventListener("abort", () => control.stop(), { once: true });
  const served = await serveControl(control).catch((error) => {
    process.stderr.write(
      `warning: no control socket (vf ctl): ${terminalLines(describeError(error))}\n`,
    );
    return null;
  });
  return {
    control,
    episode,
    close: async () => {
      await served?.close();
      if (!options.runDir || control.actions.length === 0) return;
      const path = join(options.runDir, "metadata.json");
      const metadata = await readFile(path, "utf8").then((t) => JSON.parse(t)).catch(() => null);
      if (metadata) await writeJsonAtomic(path, { ...metadata, ...control.metadata() });
    },
  };
}
