/**
 * Judges from config (`[[env.judges]]`, `[env.taskset.task] judges`): each entry validated
 * for its id, with its own endpoint, a finite weight and a reward key no other judge uses.
 * Errors name the entry: `env.judges[1].weight: must be a finite number`.
 * @module
 */
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { z } from "npm:zod@^4.6.0";
import { formatIssue, SamplingSection } from "../../config.ts";
import { ConfigError } from "../../errors.ts";
import { loadCriteria } from "./criteria.ts";
import type { Judge, JudgeEndpoint } from "./judge.ts";
import { ReferenceJudge } from "./reference.ts";
import { RubricJudge } from "./rubric.ts";

// zod's own number check turns ±Infinity away with a type message; say what is wrong.
const finite = z.custom<number>(
  (v) => typeof v === "number" && Number.isFinite(v),
  "must be a finite number",
);

const Common = {
  id: z.string(),
  /** The reward key; default the id. */
  name: z.string().min(1).optional(),
  weight: finite.optional(),
  /** The judge's model (with base_url, or from the endpoint alias). */
  model: z.string().min(1).optional(),
  base_url: z.string().min(1).optional(),
  api_key_var: z.string().min(1).optional(),
  headers: z.record(z.string(), z.string()).optional(),
  /** An alias from the endpoint registry (configs/endpoints.toml). */
  endpoint: z.string().min(1).optional(),
  /** Use the agent's endpoint and key (only when asked). */
  use_agent_endpoint: z.boolean().optional(),
  /** The judge's sampling: the keys `sampling_args` takes, typed (a typo is refused). */
  sampling: SamplingSection.optional(),
  /** A file whose text replaces the judge's template. */
  prompt: z.string().min(1).optional(),
  /** Retries of a reply without a verdict; default 2. */
  max_retries: z.number().int().min(0).optional(),
};

const ReferenceEntry = z.strictObject({
  ...Common,
  id: z.literal("reference"),
  answer_field: z.string().min(1).optional(),
  question_field: z.string().optional(),
  view: z.enum(["last_reply", "full_trace"]).optional(),
  choices: z.tuple([z.string().min(1), z.string().min(1)]).refine(
    ([a, b]) => a.toLowerCase() !== b.toLowerCase(),
    "needs two distinct, non-empty verdict labels",
  ).optional(),
});

const RubricEntry = z.strictObject({
  ...Common,
  id: z.literal("rubric"),
  /** The criteria file (.toml or .json). */
  path: z.string().min(1).optional(),
  /** One criterion written inline (yes/no), instead of a file. */
  rubric: z.string().min(1).optional(),
  /** Weights by criterion name, over the file's. */
  weights: z.record(z.string(), finite.refine((w) => w >= 0, "must be 0 or more")).optional(),
  question_field: z.string().optional(),
  answer_field: z.string().optional(),
  view: z.enum(["last_reply", "full_trace"]).optional(),
  max_criteria: z.number().int().min(1).optional(),
  structured_output: z.boolean().optional(),
});

/** The built-in judge ids. */
export const JUDGE_IDS = ["reference", "rubric"] as const;

/** A judge entry as written (validated by {@link buildJudges}). */
export type JudgeEntry = Record<string, unknown> & { id?: string };

/** Options of {@link buildJudges}. */
export interface BuildJudgesOptions {
  /** Where each list came from, for errors: `env.judges`, `env.taskset.task.judges`. */
  field: string;
  /** Where `path` and `prompt` files are read from; default the cwd. */
  baseDir?: string;
  /**
   * The endpoint of an entry: its `endpoint` alias, its `base_url`, or (only with
   * `use_agent_endpoint`) the agent's; null when it names none.
   */
  endpointOf: (entry: JudgeEndpointEntry) => JudgeEndpoint | null;
}

/** What a judge entry says about its endpoint. */
export interface JudgeEndpointEntry {
  model?: string;
  base_url?: string;
  api_key_var?: string;
  headers?: Record<string, string>;
  /** An alias from the endpoint registry. */
  endpoint?: string;
  use_agent_endpoint?: boolean;
  sampling?: Record<string, unknown>;
}

/**
 * Build judges from config lists (`[[env.judges]]`, then the task config's `judges`): every
 * entry validated, reward keys unique across all of them.
 * @throws {ConfigError} naming the entry and field
 */
export function buildJudges(
  lists: Array<{ field: string; entries: unknown }>,
  options: Omit<BuildJudgesOptions, "field">,
): Judge[] {
  const judges: Judge[] = [];
  const seen = new Map<string, string>();
  for (const { field, entries } of lists) {
    if (entries === undefined) continue;
    if (!Array.isArray(entries)) {
      throw new ConfigError(`${field}: expected a list of judge tables ([[${field}]])`);
    }
    entries.forEach((raw, i) => {
      const at = `${field}[${i}]`;
      const id = (raw as JudgeEntry)?.id;
      if (typeof id !== "string" || !id) {
        throw new ConfigError(
          `${at}.id: every judge needs an id; known: ${JUDGE_IDS.map((j) => `"${j}"`).join(", ")}`,
        );
      }
      const schema = id === "reference" ? ReferenceEntry : id === "rubric" ? RubricEntry : null;
      if (!schema) {
        throw new ConfigError(
          `${at}.id: unknown judge "${id}"; known: ${JUDGE_IDS.map((j) => `"${j}"`).join(", ")}`,
        );
      }
      const parsed = schema.safeParse(raw);
      if (!parsed.success) {
        throw new ConfigError(formatIssue(parsed.error.issues[0], at));
      }
      const entry = parsed.data;
      const name = entry.name ?? entry.id;
      const other = seen.get(name);
      if (other) {
        throw new ConfigError(
          `${at}.name: judges ${other} and ${at} share the reward key "${name}"; set a distinct name`,
        );
      }
      seen.set(name, at);
      if (entry.base_url && !entry.model) {
        throw new ConfigError(
          `${at}.model: judge "${name}" has its own base_url, so it names its model`,
        );
      }
      let endpoint: JudgeEndpoint | null;
      try {
        endpoint = options.endpointOf(entry);
      } catch (error) {
        if (error instanceof ConfigError) {
          throw new ConfigError(`${at}.endpoint: ${error.message}`, { cause: error });
        }
        throw error;
      }
      if (!endpoint) {
        throw new ConfigError(
          `${at}: judge "${name}" has no endpoint; set base_url (and api_key_var, model) or an ` +
            `endpoint alias, or use_agent_endpoint = true to share the agent's endpoint and key`,
        );
      }
      const baseDir = options.baseDir ?? ".";
      let prompt: string | undefined;
      if (entry.prompt) {
        try {
          prompt = readFileSync(resolve(baseDir, entry.prompt), "utf8");
        } catch {
          throw new ConfigError(`${at}.prompt: template file "${entry.prompt}" cannot be read`);
        }
      }
      const settings = { ...entry, name, prompt };
      if (entry.id === "reference") {
        judges.push(new ReferenceJudge(settings as never, endpoint));
        return;
      }
      const r = entry as z.infer<typeof RubricEntry>;
      if (!r.path && !r.rubric) {
        throw new ConfigError(`${at}.path: the rubric judge needs a criteria file (path)`);
      }
      const criteria = r.path
        ? loadCriteria(r.path, baseDir, `${at}.path`, { weights: r.weights })
        : [{ name: "rubric", text: r.rubric!, weight: 1, choices: ["no", "yes"] }];
      judges.push(new RubricJudge({ ...settings, criteria } as never, endpoint));
    });
  }
  return judges;
}
