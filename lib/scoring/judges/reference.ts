/**
 * The `reference` judge: does the agent's answer agree with the task's reference answer? It
 * reads the last reply (or the whole transcript, `view = "full_trace"`), scores 1 for the
 * positive choice and 0 for the negative one; an empty answer scores 0 without a call.
 * @module
 */
import { ConfigError, JudgeVerdictError } from "../../errors.ts";
import {
  Judge,
  type JudgedTrace,
  type JudgeEndpoint,
  type JudgeSettings,
  viewOf,
} from "./judge.ts";
import { parseJudgeChoice } from "./parse.ts";

/** Settings of the reference judge. */
export interface ReferenceJudgeSettings extends JudgeSettings {
  /** The task data field with the reference answer (a list is one answer per line); default `answer`. */
  answer_field?: string;
  /** The task data field with the question; default the task's prompt text. */
  question_field?: string;
  /** What the judge reads: the last reply (default) or the whole transcript. */
  view?: "last_reply" | "full_trace";
  /** The positive then the negative verdict; default `["yes", "no"]`. */
  choices?: [string, string];
}

/**
 * The reference judge's template (`{question}`, `{answer}`, `{response}`, `{positive}`,
 * `{negative}`): upstream verifiers' default (`v1/judges/reference.txt`) word for word, so
 * a judge's prompts and verdicts compare with upstream's traces.
 */
export const REFERENCE_TEMPLATE =
  `Given a task, a reference answer, and a response, determine if the response is correct — it must match the reference answer (any one of them, when several are listed) in substance (exact wording may differ).

Task:
\`\`\`
{question}
\`\`\`

Reference answer:
\`\`\`
{answer}
\`\`\`

Response:
\`\`\`
{response}
\`\`\`

Respond either "{positive}" or "{negative}" only.
`;

/** The text of a task's prompt: a string as is, messages' texts joined by blank lines. */
export function promptText(prompt: unknown): string {
  if (typeof prompt === "string") return prompt;
  if (!Array.isArray(prompt)) return "";
  return prompt.map((m) => {
    const c = (m as { content?: unknown }).content;
    if (typeof c === "string") return c;
    if (Array.isArray(c)) {
      return c.filter((p) => p?.type === "text").map((p) => String(p.text ?? "")).join("\n");
    }
    return "";
  }).filter(Boolean).join("\n\n");
}

/** A task data field as text; a list is one item per line. */
export function fieldText(
  data: Record<string, unknown>,
  field: string,
  judge: string,
): string {
  const value = data[field];
  if (value === undefined || value === null) {
    throw new ConfigError(
      `Judge "${judge}" found no "${field}" field on the task; point its ${
        field === "answer" ? "answer_field" : "field setting"
      } at a field the task data has`,
    );
  }
  return Array.isArray(value) ? value.map(String).join("\n") : String(value);
}

/** Compares the agent's answer with the task's reference answer. */
export class ReferenceJudge extends Judge<number> {
  declare readonly settings: ReferenceJudgeSettings;

  constructor(settings: ReferenceJudgeSettings, endpoint: JudgeEndpoint) {
    super(settings, endpoint, REFERENCE_TEMPLATE);
  }

  get choices(): [string, string] {
    return this.settings.choices ?? ["yes", "no"];
  }

  parse(text: string): number {
    const [positive, negative] = this.choices;
    const verdict = parseJudgeChoice(text, this.choices);
    if (verdict === positive) return 1;
    if (verdict === negative) return 0;
    throw new JudgeVerdictError(
      `judge returned no ${positive}/${negative} verdict: ${JSON.stringify(text.slice(0, 200))}`,
    );
  }

  async score(
    data: Record<string, unknown>,
    trace: JudgedTrace,
    signal?: AbortSignal,
  ): Promise<number> {
    const answer = fieldText(data, this.settings.answer_field ?? "answer", this.name);
    const response = viewOf(trace, this.settings.view ?? "last_reply").trim();
    if (!response) return 0; // nothing to judge: no call
    const question = this.settings.question_field
      ? fieldText(data, this.settings.question_field, this.name)
      : promptText(data.prompt);
    const [positive, negative] = this.choices;
    return await this.evaluate(
      { question, answer, response, positive, negative },
      { trace, signal },
    );
  }
}
