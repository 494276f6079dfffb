/**
 * `vf import --format harbor`: a Harbor job folder (one subfolder per trial with
 * `result.json`, and `agent/trajectory.json` when the agent wrote ATIF) as vf traces.
 *
 * The folder was written by someone else, so it is read as hostile input: only regular files
 * inside it are read (a trial folder, `agent/` or a file that is a link out of it is refused,
 * and so is one swapped for a link while it is opened), none past its size limit, and every
 * field is type-checked; anything else is one {@link ConfigError} naming the file and field.
 * @module
 */
import { readdirSync, realpathSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { ConfigError } from "../errors.ts";
import type { Messages } from "../types.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { TRACE_FORMAT_VERSION } from "../tasks/trace.ts";
import { ConfinedFileError, readConfined } from "../util/confined.ts";
import { atifToMessages } from "./atif.ts";
import { harborScores } from "./verifier.ts";

/** The largest `result.json` read, in bytes (Harbor writes a few kilobytes). */
export const MAX_RESULT_BYTES = 16 << 20;
/** The largest `agent/trajectory.json` read, in bytes. */
export const MAX_TRAJECTORY_BYTES = 256 << 20;

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/** A value as a message quotes it: JSON, cut short. */
function shown(v: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(v) ?? String(v);
  } catch {
    text = String(v);
  }
  return text.length > 60 ? `${text.slice(0, 60)}…` : text;
}

/** Reads the fields of one file's JSON, each checked, failing with the file and field. */
class Fields {
  constructor(readonly file: string) {}

  fail(field: string, want: string, got: unknown): never {
    throw new ConfigError(`${this.file}: ${field}: must be ${want}, not ${shown(got)}`);
  }

  /** `obj[key]` as an object, {} when absent or null. */
  object(obj: Json, key: string, at: string): Json {
    const v = obj[key];
    if (v === undefined || v === null) return {};
    return isObject(v) ? v : this.fail(`${at}${key}`, "an object", v);
  }

  /** `obj[key]` as a string, undefined when absent or null. */
  string(obj: Json, key: string, at: string): string | undefined {
    const v = obj[key];
    if (v === undefined || v === null) return undefined;
    return typeof v === "string" ? v : this.fail(`${at}${key}`, "a string", v);
  }

  /** `obj[key]` as a count (a whole number from 0), 0 when absent or null. */
  count(obj: Json, key: string, at: string): number {
    const v = obj[key];
    if (v === undefined || v === null) return 0;
    return typeof v === "number" && Number.isInteger(v) && v >= 0
      ? v
      : this.fail(`${at}${key}`, "a whole number from 0", v);
  }
}

/** The JSON of `path`, a regular file under the real job folder `top`; undefined when absent. */
function readJson(top: string, path: string, maxBytes: number): unknown {
  let bytes;
  try {
    bytes = readConfined(top, path, maxBytes);
  } catch (error) {
    if (!(error instanceof ConfinedFileError)) throw error;
    if (error.reason === "missing") return undefined;
    const why = {
      outside: "leads outside the job folder (a link); vf import reads only files inside it",
      "not-file": "is not a regular file",
      changed: "changed while it was being read (swapped for a link?)",
      "too-large": `is over vf import's limit of ${maxBytes >> 20} MiB`,
    }[error.reason];
    throw new ConfigError(`${path}: ${why}`);
  }
  try {
    return JSON.parse(bytes.toString("utf8"));
  } catch (error) {
    throw new ConfigError(`${path}: not JSON: ${(error as Error).message.slice(0, 200)}`);
  }
}

function harborError(type: string, message: string, phase: string): TaskTrace["error"] {
  return {
    error: type,
    message,
    error_chain_repr: `${type}(${JSON.stringify(message)})`,
    error_chain_str: `${type}: ${message}`,
    phase,
    // Harbor does not say whose failure it was, and nothing was scored: never a 0.
    infra: true,
  };
}

/** A trace's `reward_weights`: the weights that are not 1, if any (as a run records them). */
function weightsNot1(
  weights: Record<string, number> = {},
): { reward_weights?: Record<string, number> } {
  const out = Object.fromEntries(Object.entries(weights).filter(([, w]) => w !== 1));
  return Object.keys(out).length ? { reward_weights: out } : {};
}

/** One trial folder's trace, or null when it holds no `result.json`. */
function trialTrace(
  top: string,
  dir: string,
  runId: string,
  counts: Map<string, number>,
): TaskTrace | null {
  const resultPath = join(dir, "result.json");
  const result = readJson(top, resultPath, MAX_RESULT_BYTES);
  if (result === undefined) return null;
  const f = new Fields(resultPath);
  if (!isObject(result)) return f.fail("(the document)", "an object", result);
  const taskName = f.string(result, "task_name", "") ?? basename(dir).replace(/__[^_]+$/, "");
  const agentInfo = f.object(result, "agent_info", "");
  const modelInfo = f.object(agentInfo, "model_info", "agent_info.");
  const agentResult = f.object(result, "agent_result", "");
  const verifier = f.object(result, "verifier_result", "");
  const rawRewards = f.object(verifier, "rewards", "verifier_result.");
  const exception = result.exception_info === undefined || result.exception_info === null
    ? null
    : f.object(result, "exception_info", "");
  const trajectoryPath = join(dir, "agent", "trajectory.json");
  let messages: Messages = [];
  let model = f.string(modelInfo, "name", "agent_info.model_info.") ?? "";
  const doc = readJson(top, trajectoryPath, MAX_TRAJECTORY_BYTES);
  if (doc !== undefined) {
    messages = atifToMessages(doc, trajectoryPath);
    const t = new Fields(trajectoryPath);
    const named = t.string(t.object(doc as Json, "agent", ""), "model_name", "agent.");
    model ||= named ?? "";
  }
  const rewards: Record<string, number> = {};
  for (const [k, v] of Object.entries(rawRewards)) {
    if (typeof v === "number" && Number.isFinite(v)) rewards[k] = v;
  }
  const scored = !exception && Object.keys(rewards).length > 0;
  const index = counts.get(taskName) ?? 0;
  counts.set(taskName, index + 1);
  const started = Date.parse(f.string(result, "started_at", "") ?? "");
  const scores = scored ? harborScores(rewards) : null;
  return {
    format_version: TRACE_FORMAT_VERSION,
    trace_id: f.string(result, "id", "") ?? crypto.randomUUID(),
    run_id: runId,
    taskset: "harbor-import",
    task: { key: taskName, idx: 0, hash: "" },
    example_id: 0,
    rollout_index: index,
    model,
    harness: f.string(agentInfo, "name", "agent_info.") ?? "harbor",
    role: "agent",
    trainable: true,
    attempt: 0,
    runtime: { type: "harbor" },
    scoring: { mode: "shared", attempts: 1 },
    messages,
    model_calls: [],
    tool_calls: [],
    stop_condition: exception ? "has_error" : null,
    reward: scores ? scores.reward : null,
    rewards: scored ? rewards : {},
    ...(scores && weightsNot1(scores.weights)),
    metrics: {},
    ok: !exception,
    error: exception
      ? harborError(
        f.string(exception, "exception_type", "exception_info.") ?? "HarborError",
        f.string(exception, "exception_message", "exception_info.") ?? "the trial failed",
        "agent",
      )
      : scored
      ? null
      : harborError("HarborError", "the trial has no verifier result", "scoring"),
    usage: {
      input_tokens: f.count(agentResult, "n_input_tokens", "agent_result."),
      output_tokens: f.count(agentResult, "n_output_tokens", "agent_result."),
    },
    timing: Number.isFinite(started) ? { started_at: started / 1000 } : {},
    info: { harbor_trial: basename(dir) },
  } as TaskTrace;
}

/**
 * A Harbor job folder (one subfolder per trial with `result.json`, and
 * `agent/trajectory.json` when the agent wrote ATIF) as vf traces, trials in folder order.
 * A trial with an exception is an error on its trace, never a 0; one without a verifier
 * result is unscored. A trial folder that is a link is passed over; a file inside one that
 * leads out of the job folder is refused.
 * @param jobDir the job folder Harbor wrote (`jobs/<name>`)
 * @param runId the run id each trace carries
 * @returns one trace per trial
 * @throws {ConfigError} naming the folder when it holds no trial, or the file and field that
 * is not what Harbor writes
 * @example
 * ```ts
 * const traces = await importHarborJob("jobs/2026-01-01__12-00-00", "imported");
 * console.log(traces.map((t) => [t.task.key, t.reward]));
 * ```
 */
export function importHarborJob(jobDir: string, runId: string): Promise<TaskTrace[]> {
  try {
    return Promise.resolve(readJob(jobDir, runId));
  } catch (error) {
    return Promise.reject(error);
  }
}

function readJob(jobDir: string, runId: string): TaskTrace[] {
  let top: string;
  try {
    top = realpathSync(jobDir);
  } catch {
    throw new ConfigError(`${jobDir}: no such folder`);
  }
  if (!statSync(top).isDirectory()) throw new ConfigError(`${jobDir}: not a folder`);
  const traces: TaskTrace[] = [];
  const counts = new Map<string, number>();
  const entries = readdirSync(top, { withFileTypes: true })
    .sort((a, b) => a.name < b.name ? -1 : 1);
  for (const entry of entries) {
    // A link is not followed, even to a folder inside: each trial is read once, from here.
    if (!entry.isDirectory()) continue;
    const trace = trialTrace(top, join(jobDir, entry.name), runId, counts);
    if (trace) traces.push(trace);
  }
  if (traces.length === 0) {
    throw new ConfigError(`${jobDir}: no Harbor trial here (no */result.json)`);
  }
  return traces;
}
