/**
 * Criteria a judge decides: from a `.toml` or `.json` rubric file (`[[criteria]] name, text,
 * weight = 1, choices = ["no", "yes"]`, choices listed worst to best), and how a choice scores.
 * @module
 */
import { readFileSync } from "node:fs";
import { extname, resolve } from "node:path";
import { parse as parseToml } from "npm:smol-toml@^1.4.0";
import { z } from "npm:zod@^4.6.0";
import { ConfigError } from "../../errors.ts";

/** One thing the judge decides, answered with one of `choices` (worst to best). */
export interface Criterion {
  name: string;
  text: string;
  weight: number;
  choices: string[];
}

/** The criterion used when no rubric file is given. */
export const DEFAULT_CRITERIA: Criterion[] = [{
  name: "solved",
  text: "The agent fully solved the task.",
  weight: 1,
  choices: ["no", "yes"],
}];

const CriterionEntry = z.strictObject({
  name: z.string().min(1),
  text: z.string().min(1),
  weight: z.custom<number>(
    (v) => typeof v === "number" && Number.isFinite(v) && v >= 0,
    "must be a finite number, 0 or more",
  ).default(1),
  choices: z.array(z.string().min(1)).min(2, "needs at least 2 choices").default(["no", "yes"])
    .refine((c) => new Set(c).size === c.length, "has duplicate choices"),
});

const CriteriaFile = z.union([
  z.looseObject({ criteria: z.array(CriterionEntry) }),
  z.array(CriterionEntry),
]);

/**
 * Criteria from a rubric file: TOML when its name ends in `.toml`, else JSON; either an
 * object with a `criteria` list or a bare list of `{ name, text, weight = 1, choices =
 * ["no", "yes"] }` (weights ≥ 0, at least one positive; choices worst to best, distinct).
 * `weights` overrides weights by criterion name. `field` names the config key in errors.
 * @throws {ConfigError} when the file is missing, unreadable or malformed
 */
export function loadCriteria(
  path: string,
  baseDir: string,
  field: string,
  options: { weights?: Record<string, number> } = {},
): Criterion[] {
  const full = resolve(baseDir, path);
  const fail = (message: string) => new ConfigError(`${field}: criteria file "${path}" ${message}`);
  let text: string;
  try {
    text = readFileSync(full, "utf8");
  } catch (error) {
    const code = (error as { code?: string }).code;
    throw fail(code === "ENOENT" ? "does not exist" : `cannot be read (${code ?? error})`);
  }
  let raw: unknown;
  try {
    raw = extname(full).toLowerCase() === ".toml" ? parseToml(text) : JSON.parse(text);
  } catch (error) {
    throw fail(
      `is not valid ${extname(full).toLowerCase() === ".toml" ? "TOML" : "JSON"}: ${
        (error as Error).message
      }`,
    );
  }
  const parsed = CriteriaFile.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues.at(-1)!;
    const deepest = (issue as { errors?: Array<Array<{ path: PropertyKey[]; message: string }>> })
      .errors?.flat().sort((a, b) => b.path.length - a.path.length)[0] ?? issue;
    throw new ConfigError(
      `${field}: criteria file "${path}": ${deepest.path.join(".") || "(top)"}: ${deepest.message}`,
    );
  }
  const list = Array.isArray(parsed.data) ? parsed.data : parsed.data.criteria;
  if (list.length === 0) throw fail("lists no criteria");
  const names = list.map((c) => c.name);
  const dup = names.find((n, i) => names.indexOf(n) !== i);
  if (dup) throw fail(`names criterion "${dup}" twice`);
  const overrides = options.weights ?? {};
  const unknown = Object.keys(overrides).filter((k) => !names.includes(k));
  if (unknown.length) {
    throw new ConfigError(
      `${field}: weights name no criterion of "${path}": ${
        unknown.map((k) => `"${k}"`).join(", ")
      }`,
    );
  }
  const criteria = list.map((c) => ({ ...c, weight: overrides[c.name] ?? c.weight }));
  const total = criteria.reduce((a, c) => a + c.weight, 0);
  if (!Number.isFinite(total)) throw fail("has a total weight that is not finite");
  if (!(total > 0)) throw fail("has no criterion with a positive weight");
  return criteria;
}

/** What a choice scores: its position from worst (0) to best (1). */
export function choiceScore(criterion: Criterion, choice: string): number {
  return criterion.choices.indexOf(choice) / (criterion.choices.length - 1);
}
