/**
 * The result shape of a judge that decides criteria: its verdicts (`{"verdicts": [{name,
 * reason, verdict}]}`), how they score (each choice's position, the total their weighted
 * mean), and the keys the scores go under (`<judge>/<criterion>` metrics beside the judge's
 * reward). The rubric judge and the agentic judges both give this shape; what fails is a
 * {@link JudgeVerdictError}, never a score of 0.
 * @module
 */
import { JudgeVerdictError } from "../../errors.ts";
import { choiceScore, type Criterion } from "./criteria.ts";

/** One criterion's verdict, as a judge gives it. */
export interface CriterionVerdict {
  name: string;
  /** Why: given before the verdict, so it can be audited. */
  reason?: string;
  /** One of the criterion's choices, exactly as spelled. */
  verdict: string;
}

/** A judge's verdicts, one per criterion. */
export interface Verdicts {
  verdicts: CriterionVerdict[];
}

/** What is wrong with a judge's verdicts; each judge words it for its own readers. */
export type VerdictFault =
  | { kind: "no_list" }
  | { kind: "unknown"; name: string; criteria: Criterion[] }
  | { kind: "repeated"; name: string }
  | { kind: "not_allowed"; criterion: Criterion; verdict: string }
  | { kind: "missing"; criteria: Criterion[] };

/** Criteria names in quotes, comma separated: `"a", "b"`. */
export function quotedNames(items: Array<{ name: string } | string>): string {
  return items.map((c) => `"${typeof c === "string" ? c : c.name}"`).join(", ");
}

/**
 * Each criterion's score from a judge's verdicts (`value.verdicts`), in the criteria's order:
 * exactly one verdict per criterion, each one of its choices.
 * @throws {JudgeVerdictError} with `word(fault)` as its message when the list is missing,
 *   names another criterion, repeats one, answers with a choice it does not allow, or misses one
 */
export function scoreVerdicts(
  value: unknown,
  criteria: Criterion[],
  word: (fault: VerdictFault) => string,
): Record<string, number> {
  const fail = (fault: VerdictFault) => new JudgeVerdictError(word(fault));
  const list = (value as Partial<Verdicts> | null | undefined)?.verdicts;
  if (!Array.isArray(list)) throw fail({ kind: "no_list" });
  const scores: Record<string, number> = {};
  for (const entry of list) {
    const name = String((entry as { name?: unknown } | null)?.name);
    const verdict = String((entry as { verdict?: unknown } | null)?.verdict);
    const criterion = criteria.find((c) => c.name === name);
    if (!criterion) throw fail({ kind: "unknown", name, criteria });
    if (name in scores) throw fail({ kind: "repeated", name });
    if (!criterion.choices.includes(verdict)) {
      throw fail({ kind: "not_allowed", criterion, verdict });
    }
    scores[name] = choiceScore(criterion, verdict);
  }
  const missing = criteria.filter((c) => !(c.name in scores));
  if (missing.length) throw fail({ kind: "missing", criteria: missing });
  return Object.fromEntries(criteria.map((c) => [c.name, scores[c.name]]));
}

/** The criteria's weighted mean of `scores` (every criterion scored). */
export function weightedScore(criteria: Criterion[], scores: Record<string, number>): number {
  const total = criteria.reduce((a, c) => a + c.weight, 0);
  return criteria.reduce((a, c) => a + c.weight * scores[c.name], 0) / total;
}

/** The metrics a judge's criterion scores go under: `<judge>/<criterion>`. */
export function criterionMetrics(
  judge: string,
  scores: Record<string, number>,
): Record<string, number> {
  return Object.fromEntries(Object.entries(scores).map(([k, v]) => [`${judge}/${k}`, v]));
}
