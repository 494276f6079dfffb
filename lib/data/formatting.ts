/**
 * The dataset formatting pipeline run once per built dataset: `example_id` assignment,
 * prompt construction from `question`, system prompt and few-shot, and the default `task`.
 * @module
 */
import { ConfigError } from "../errors.ts";
import type { Message, Row } from "../types.ts";
import type { RowOrigin } from "./dataset.ts";

/** Options of {@link formatRows}. */
export interface FormatOptions {
  /** Prepended as a system message; with a prompt column only when no system message leads. */
  systemPrompt?: string | null;
  /** Few-shot messages placed between the system prompt and the question. */
  fewShot?: Message[] | null;
  /** Default for rows without a `task`; "default" when empty. */
  envId?: string;
  /** Names the dataset in errors when its rows have no known file, e.g. "eval_dataset". */
  label?: string;
  /** Where row `i` came from (its file and index there), for errors; null when unknown. */
  origin?: (index: number) => RowOrigin | null;
}

/**
 * Format rows into rollout inputs. Pure: returns new row objects. A row's prompt is its
 * `prompt`, else one built from its `question`; a row with neither is an error naming the
 * file (or the dataset) and the row.
 */
export function formatRows(input: Row[], options: FormatOptions = {}): Row[] {
  const label = options.label ?? "dataset";
  const where = (i: number): string => {
    const o = options.origin?.(i);
    return o ? `${o.source}: row ${o.row}` : `${label}: row ${i}`;
  };
  let rows = input.map((r) => ({ ...r }));
  const columns = new Set(rows.flatMap((r) => Object.keys(r)));

  // 1. example_id: a non-integer first value means the column is a source id.
  if (columns.has("example_id") && rows.length > 0 && !Number.isInteger(rows[0].example_id)) {
    rows = rows.map(({ example_id, ...rest }) => ({ ...rest, src_id: example_id }));
    columns.delete("example_id");
    columns.add("src_id");
  }
  if (!columns.has("example_id")) rows.forEach((r, i) => (r.example_id = i));

  // 2. prompt: each row's own, else one built from its question.
  if (!columns.has("prompt") && !columns.has("question")) {
    const o = rows.length ? options.origin?.(0) : null;
    throw new ConfigError(
      `${o ? o.source : label}: no "question" (or "prompt") column (columns: ${
        [...columns].map((c) => `"${c}"`).join(", ") || "none"
      }); add one of them`,
    );
  }
  const system = options.systemPrompt;
  const fewShot = options.fewShot;
  rows.forEach((r, i) => {
    if (r.prompt !== undefined && r.prompt !== null) {
      if (system === null || system === undefined) return;
      if (!Array.isArray(r.prompt)) {
        throw new ConfigError(
          `${where(i)}: "prompt" must be a list of messages to prepend a system prompt`,
        );
      }
      const first = r.prompt[0] as Message | undefined;
      if (first?.role !== "system") r.prompt = [{ role: "system", content: system }, ...r.prompt];
      return;
    }
    if (r.question === undefined || r.question === null) {
      throw new ConfigError(
        `${where(i)}: no "question" (or "prompt") column; give every row one of them`,
      );
    }
    const prompt: Message[] = [];
    if (system) prompt.push({ role: "system", content: system });
    if (fewShot && fewShot.length > 0) prompt.push(...structuredClone(fewShot));
    prompt.push({ role: "user", content: String(r.question) });
    r.prompt = prompt;
  });
  if (columns.has("prompt") && fewShot !== null && fewShot !== undefined) {
    console.warn(`few_shot is ignored for rows of ${label} that have a "prompt"`);
  }

  // 3. task
  if (!columns.has("task")) {
    const task = options.envId || "default";
    rows.forEach((r) => (r.task = task));
  }
  return rows;
}

/** Parse a JSON-string `info` into an object; objects pass through. */
export function parseInfo(info: unknown, where = "info"): Record<string, unknown> {
  if (info === undefined || info === null || info === "") return {};
  if (typeof info === "string") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(info);
    } catch (error) {
      throw new ConfigError(`${where} is not valid JSON: ${(error as Error).message}`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new ConfigError(`${where} must be a JSON object`);
    }
    return parsed as Record<string, unknown>;
  }
  if (typeof info === "object" && !Array.isArray(info)) return info as Record<string, unknown>;
  throw new ConfigError(`${where} must be an object or a JSON string`);
}
