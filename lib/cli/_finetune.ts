/**
 * Rollouts of a run as fine-tuning data: chat-messages JSONL (OpenAI's shape, what TRL and most
 * SFT trainers read) or ShareGPT JSONL (`conversations` of `from`/`value` turns, with
 * `function_call` and `observation` turns for tools), from either run layout: `results.jsonl`
 * of `vf eval` or `traces.jsonl` of `vf run`.
 *
 * Run files may be written by untrusted environment code, so every field is checked: a row
 * that is not what it should be is skipped with a warning naming the file and line, and a
 * rollout that errored or was never scored never passes a reward filter.
 * @module
 */
import { readFile } from "node:fs/promises";
import { stepSegments } from "../harbor/segments.ts";

/** The formats {@link finetuneRows} writes. */
export type FinetuneFormat = "messages" | "sharegpt";

/** Which rollouts to keep. */
export interface FinetuneFilter {
  /** Keep rollouts scored at least this (unscored and errored ones never pass). */
  minReward?: number;
  /** Keep only rollouts that passed: scored, no error, reward ≥ `passThreshold`. */
  success?: boolean;
  /** The reward a rollout needs to count as a success; default 0.5 (vf's pass@k threshold). */
  passThreshold?: number;
}

/** One rollout read from a run file, checked. */
interface Rollout {
  /** `file:line`. */
  where: string;
  messages: Msg[];
  tools: unknown[] | null;
  reward: number | null;
  errored: boolean;
  meta: Record<string, unknown>;
}

type Part = { type: "text"; text: string } | Record<string, unknown>;
interface Msg {
  role: "system" | "user" | "assistant" | "tool";
  content: string | Part[] | null;
  tool_calls?: { id: string; name: string; arguments: string }[];
  tool_call_id?: string;
  reasoning_content?: string;
}

/** What was written and what was left out. */
export interface FinetuneReport {
  rows: string[];
  read: number;
  kept: number;
  skipped: number;
  filtered: number;
}

const ROLES = new Set(["system", "user", "assistant", "tool"]);

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** A message checked field by field; a string saying what is wrong, else the message. */
function checkMessage(v: unknown, at: string): Msg | string {
  if (!isObj(v)) return `${at} is not an object`;
  const role = v.role;
  if (typeof role !== "string" || !ROLES.has(role)) {
    return `${at}.role ${
      JSON.stringify(role)?.slice(0, 40)
    } is not system, user, assistant or tool`;
  }
  const c = v.content;
  let content: Msg["content"];
  if (c === null || c === undefined) content = null;
  else if (typeof c === "string") content = c;
  else if (Array.isArray(c)) {
    for (const [i, p] of c.entries()) {
      if (!isObj(p) || typeof p.type !== "string") return `${at}.content[${i}] is not a part`;
      if (p.type === "text" && typeof p.text !== "string") {
        return `${at}.content[${i}].text is not a string`;
      }
    }
    content = c as Part[];
  } else return `${at}.content is not text, parts or null`;
  const out: Msg = { role: role as Msg["role"], content };
  if (v.tool_calls !== undefined && v.tool_calls !== null) {
    if (role !== "assistant" || !Array.isArray(v.tool_calls)) {
      return `${at}.tool_calls is not a list on an assistant message`;
    }
    const calls: NonNullable<Msg["tool_calls"]> = [];
    for (const [i, t] of v.tool_calls.entries()) {
      if (
        !isObj(t) || typeof t.id !== "string" || typeof t.name !== "string" || !t.name ||
        typeof t.arguments !== "string"
      ) return `${at}.tool_calls[${i}] needs a string id, name and arguments`;
      calls.push({ id: t.id, name: t.name, arguments: t.arguments });
    }
    if (calls.length) out.tool_calls = calls;
  }
  if (role === "tool") {
    if (typeof v.tool_call_id !== "string") return `${at}.tool_call_id is not a string`;
    out.tool_call_id = v.tool_call_id;
  }
  if (role === "assistant" && typeof v.reasoning_content === "string" && v.reasoning_content) {
    out.reasoning_content = v.reasoning_content;
  }
  return out;
}

function checkMessages(v: unknown, at: string): Msg[] | string {
  if (!Array.isArray(v)) return `${at} is not a list`;
  const out: Msg[] = [];
  for (const [i, m] of v.entries()) {
    const checked = checkMessage(m, `${at}[${i}]`);
    if (typeof checked === "string") return checked;
    out.push(checked);
  }
  return out;
}

function reward(v: unknown): number | null | string {
  if (v === null || v === undefined) return null;
  return typeof v === "number" && Number.isFinite(v)
    ? v
    : `reward ${JSON.stringify(v)} is not a number`;
}

/**
 * A trace (one line of `traces.jsonl`, or one of an episode line's traces): one rollout, or,
 * for a multi-step Harbor trace, one per step's session (each a conversation of its own).
 */
function traceRollout(t: unknown, where: string, at: string): Rollout[] | string | null {
  if (!isObj(t)) return `${at} is not an object`;
  if (typeof t.trace_id !== "string") return `${at}.trace_id is not a string`;
  if (!isObj(t.task) || typeof t.task.key !== "string") return `${at}.task.key is not a string`;
  // Judges and simulated users are not training data.
  if (t.trainable === false) return null;
  const messages = checkMessages(t.messages, `${at}.messages`);
  if (typeof messages === "string") return messages;
  const r = reward(t.reward);
  if (typeof r === "string") return `${at}.${r}`;
  const rollout: Rollout = {
    where,
    messages,
    tools: null,
    reward: r,
    errored: t.error !== null && t.error !== undefined || t.ok === false,
    meta: {
      task: t.task.key,
      trace_id: t.trace_id,
      ...(typeof t.role === "string" ? { role: t.role } : {}),
      ...(Number.isInteger(t.rollout_index) ? { rollout_index: t.rollout_index } : {}),
    },
  };
  const segments = stepSegments(t.info, messages.length);
  if (typeof segments === "string") return `${at}.${segments}`;
  if (!segments) return [rollout];
  // Each step's session on its own; the trial's reward and error gate them all, as a trial.
  return segments.map((seg) => ({
    ...rollout,
    messages: messages.slice(seg.from, seg.to),
    meta: { ...rollout.meta, step: seg.name, step_index: seg.index, step_reward: seg.reward },
  }));
}

/** A `results.jsonl` row of `vf eval`: the prompt, then the completion. */
function resultRollout(o: Record<string, unknown>, where: string): Rollout | string {
  if (!Number.isInteger(o.example_id)) return `no integer "example_id"`;
  const prompt = checkMessages(o.prompt, "prompt");
  if (typeof prompt === "string") return prompt;
  const completion = checkMessages(o.completion, "completion");
  if (typeof completion === "string") return completion;
  const r = reward(o.reward);
  if (typeof r === "string") return r;
  if (o.tool_defs !== undefined && o.tool_defs !== null && !Array.isArray(o.tool_defs)) {
    return "tool_defs is not a list";
  }
  const tools = Array.isArray(o.tool_defs) ? o.tool_defs : null;
  if (tools?.some((t) => !isObj(t))) return "tool_defs holds a non-object";
  return {
    where,
    messages: [...prompt, ...completion],
    tools,
    reward: r,
    errored: o.error !== null && o.error !== undefined,
    meta: {
      example_id: o.example_id,
      ...(typeof o.task === "string" ? { task: o.task } : {}),
      ...(typeof o.trajectory_id === "string" ? { trajectory_id: o.trajectory_id } : {}),
    },
  };
}

/** The JSON objects of a JSONL file with their 1-based line numbers; malformed lines warned. */
async function lines(
  path: string,
  warn: (m: string) => void,
): Promise<Array<[number, Record<string, unknown>]>> {
  const out: Array<[number, Record<string, unknown>]> = [];
  for (const [i, line] of (await readFile(path, "utf8")).split("\n").entries()) {
    if (!line.trim()) continue;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (error) {
      warn(`${path}:${i + 1}: skipping a malformed line (${(error as Error).message})`);
      continue;
    }
    if (!isObj(v)) warn(`${path}:${i + 1}: skipping a line that is not a JSON object`);
    else out.push([i + 1, v]);
  }
  return out;
}

/**
 * The rollouts of a run file, checked: `results.jsonl` (one row per rollout) or `traces.jsonl`
 * (trace lines and episode lines; a retried episode's latest line wins, as everywhere in vf).
 */
async function readRollouts(
  path: string,
  layout: "results" | "traces",
  warn: (m: string) => void,
): Promise<{ rollouts: Rollout[]; skipped: number }> {
  let skipped = 0;
  const bad = (where: string, why: string) => {
    skipped++;
    warn(`${where}: skipping a malformed row (${why})`);
  };
  if (layout === "results") {
    const rollouts: Rollout[] = [];
    const rows = await lines(path, (m) => (skipped++, warn(m)));
    // A row a later row re-ran (`vf ctl requeue` writes `retry_of`) is not a rollout of the run.
    const retried = new Set(rows.map(([, o]) => o.retry_of).filter((t) => typeof t === "string"));
    for (const [n, o] of rows) {
      if (typeof o.trajectory_id === "string" && retried.has(o.trajectory_id)) continue;
      const r = resultRollout(o, `${path}:${n}`);
      if (typeof r === "string") bad(`${path}:${n}`, r);
      else rollouts.push(r);
    }
    return { rollouts, skipped };
  }
  const latest = new Map<string, Rollout[]>();
  for (const [n, o] of await lines(path, (m) => (skipped++, warn(m)))) {
    const where = `${path}:${n}`;
    const task = isObj(o.task) && typeof o.task.key === "string" ? o.task.key : null;
    if (task === null) {
      bad(where, "task.key is not a string");
      continue;
    }
    const episode = o.kind === "episode";
    const list = episode ? o.traces : [o];
    if (!Array.isArray(list)) {
      bad(where, "traces is not a list");
      continue;
    }
    const index = episode ? o.episode_index : o.rollout_index ?? 0;
    const got: Rollout[] = [];
    let broken: string | null = null;
    for (const [i, t] of list.entries()) {
      const r = traceRollout(t, where, episode ? `traces[${i}]` : "trace");
      if (typeof r === "string") broken = r;
      else if (r) got.push(...r);
    }
    // An episode that failed as a whole scored none of its traces.
    if (episode && Array.isArray(o.errors) && o.errors.length) {
      for (const r of got) r.errored = true;
    }
    if (broken) bad(where, broken);
    else latest.set(`${task}#${String(index)}`, got);
  }
  return { rollouts: [...latest.values()].flat(), skipped };
}

function passes(r: Rollout, f: FinetuneFilter): boolean {
  const gated = f.minReward !== undefined || f.success;
  if (!gated) return true;
  if (r.errored || r.reward === null) return false;
  if (f.minReward !== undefined && r.reward < f.minReward) return false;
  if (f.success && r.reward < (f.passThreshold ?? 0.5)) return false;
  return true;
}

function args(raw: string): unknown {
  try {
    return JSON.parse(raw || "{}");
  } catch {
    return raw;
  }
}

function openai(m: Msg): Record<string, unknown> {
  return {
    role: m.role,
    content: m.content,
    ...(m.reasoning_content ? { reasoning_content: m.reasoning_content } : {}),
    ...(m.tool_calls
      ? {
        tool_calls: m.tool_calls.map((c) => ({
          id: c.id,
          type: "function",
          function: { name: c.name, arguments: c.arguments },
        })),
      }
      : {}),
    ...(m.tool_call_id !== undefined ? { tool_call_id: m.tool_call_id } : {}),
  };
}

/** The text of a message; null when it holds a part that is not text. */
function plain(content: Msg["content"]): string | null {
  if (content === null) return "";
  if (typeof content === "string") return content;
  let out = "";
  for (const p of content) {
    if (p.type !== "text") return null;
    out += (p as { text: string }).text;
  }
  return out;
}

/** ShareGPT turns; a string saying why the rollout cannot be written so. */
function sharegpt(r: Rollout): Record<string, unknown> | string {
  const turns: Array<{ from: string; value: string }> = [];
  let system: string | undefined;
  for (const [i, m] of r.messages.entries()) {
    const value = plain(m.content);
    if (value === null) return `messages[${i}] holds a part that is not text; ShareGPT is text`;
    if (m.role === "system") {
      if (i === 0) system = value;
      else turns.push({ from: "system", value });
    } else if (m.role === "user") turns.push({ from: "human", value });
    else if (m.role === "tool") turns.push({ from: "observation", value });
    else if (m.tool_calls?.length) {
      const calls = m.tool_calls.map((c) => ({ name: c.name, arguments: args(c.arguments) }));
      turns.push({
        from: "function_call",
        value: JSON.stringify(calls.length === 1 ? calls[0] : calls),
      });
    } else turns.push({ from: "gpt", value });
  }
  return {
    conversations: turns,
    ...(system !== undefined ? { system } : {}),
    ...(r.tools ? { tools: JSON.stringify(r.tools) } : {}),
    metadata: { ...r.meta, reward: r.reward, source: r.where },
  };
}

/**
 * The rows of a fine-tuning JSONL file from one run file, in order, with counts of what was
 * read, skipped (malformed, each warned by `warn` with its file and line) and filtered out.
 */
export async function finetuneRows(
  path: string,
  layout: "results" | "traces",
  format: FinetuneFormat,
  filter: FinetuneFilter,
  warn: (message: string) => void,
): Promise<FinetuneReport> {
  const { rollouts, skipped } = await readRollouts(path, layout, warn);
  const rows: string[] = [];
  let filtered = 0;
  let unwritable = 0;
  for (const r of rollouts) {
    if (!passes(r, filter)) {
      filtered++;
      continue;
    }
    if (format === "messages") {
      rows.push(JSON.stringify({
        messages: r.messages.map(openai),
        ...(r.tools ? { tools: r.tools } : {}),
        metadata: { ...r.meta, reward: r.reward, source: r.where },
      }));
      continue;
    }
    const row = sharegpt(r);
    if (typeof row === "string") {
      unwritable++;
      warn(`${r.where}: skipping a rollout (${row})`);
    } else rows.push(JSON.stringify(row));
  }
  return {
    rows,
    read: rollouts.length + skipped,
    kept: rows.length,
    skipped: skipped + unwritable,
    filtered,
  };
}
