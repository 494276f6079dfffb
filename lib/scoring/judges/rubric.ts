/**
 * The `rubric` judge: grades a trace against criteria from a rubric file, each answered with
 * one of its choices (worst to best). Criteria go to the judge in batches (`max_criteria`,
 * concurrently; one failing cancels the rest). Each criterion is a `<judge>/<criterion>`
 * metric scoring its choice's position (0 worst, 1 best); the reward is their weighted mean.
 * @module
 */
import type { Messages, SamplingArgs } from "../../types.ts";
import type { Criterion } from "./criteria.ts";
import {
  Judge,
  type JudgedTrace,
  type JudgeEndpoint,
  type JudgeSettings,
  viewOf,
} from "./judge.ts";
import { findJsonObject } from "./parse.ts";
import { fieldText, promptText } from "./reference.ts";
import { criterionMetrics, quotedNames, scoreVerdicts, weightedScore } from "./verdicts.ts";

/** Settings of the rubric judge (criteria already loaded). */
export interface RubricJudgeSettings extends JudgeSettings {
  criteria: Criterion[];
  /** The task data field with the question; default the task's prompt text. */
  question_field?: string;
  /** A task data field with a reference solution to show the judge; default none. */
  answer_field?: string;
  /** What the judge reads: the whole transcript (default) or the last reply. */
  view?: "last_reply" | "full_trace";
  /** Criteria per call; default all in one. */
  max_criteria?: number;
  /** Ask the endpoint for JSON that fits the verdict schema (`response_format`). */
  structured_output?: boolean;
}

/**
 * The rubric judge's template (`{question}`, `{reference}`, `{response}`, `{criteria}`):
 * upstream verifiers' default (`v1/judges/rubric.txt`) word for word, so traces compare.
 */
export const RUBRIC_TEMPLATE =
  `Given a task, a response, and a list of grading criteria, determine for each criterion whether the response satisfies it.

Task:
\`\`\`
{question}
\`\`\`
{reference}
Response:
\`\`\`
{response}
\`\`\`

Criteria:
{criteria}

For each criterion, answer under its exact name with exactly one of the options given in parentheses after it.
`;

/**
 * Appended to the prompt unless the endpoint is asked for structured output (upstream's
 * wording): each verdict comes after a one-sentence reason, so it can be audited.
 */
export const RUBRIC_JSON_SUFFIX =
  "\n\nRespond with ONLY a JSON object and nothing else, in exactly this shape:\n" +
  '{"verdicts": [{"name": "<criterion name>", "reason": "<one sentence citing specific ' +
  'evidence from the response>", "verdict": "<answer>"}, ...]}\n' +
  "with one entry per criterion, using each criterion's exact name. For each, first write the " +
  "one-sentence reason grounded in the response, then set verdict to exactly one of the options " +
  "listed in parentheses after that criterion.";

/** A code fence longer than any backtick run in `text` (at least three backticks). */
export function fenceFor(text: string): string {
  const longest = Math.max(2, ...[...text.matchAll(/`+/g)].map((m) => m[0].length));
  return "`".repeat(longest + 1);
}

/** One criterion's line in the prompt. */
export function criterionLine(c: Criterion): string {
  return `- ${c.name}: ${c.text} (answer one of, worst to best: ${c.choices.join(", ")})`;
}

const VERDICT_SCHEMA = {
  type: "json_schema",
  json_schema: {
    name: "verdicts",
    strict: true,
    schema: {
      type: "object",
      additionalProperties: false,
      required: ["verdicts"],
      properties: {
        verdicts: {
          type: "array",
          items: {
            type: "object",
            additionalProperties: false,
            required: ["name", "reason", "verdict"],
            properties: {
              name: { type: "string" },
              reason: { type: "string" },
              verdict: { type: "string" },
            },
          },
        },
      },
    },
  },
};

/** Grades against criteria; the reward is the weighted mean of the criteria's scores. */
export class RubricJudge extends Judge<Record<string, number>> {
  declare readonly settings: RubricJudgeSettings;

  constructor(settings: RubricJudgeSettings, endpoint: JudgeEndpoint) {
    super(settings, endpoint, RUBRIC_TEMPLATE);
  }

  /** Parse a reply for the whole rubric (see {@link RubricJudge.parseBatch}). */
  parse(text: string): Record<string, number> {
    return this.parseBatch(text, this.settings.criteria);
  }

  /**
   * The scores of one batch: one verdict per criterion of the batch, each one of its choices
   * (exactly as spelled).
   * @throws {JudgeVerdictError} when the reply has no verdicts object, misses or repeats a
   *   criterion, names another, or answers with a choice the criterion does not allow
   */
  parseBatch(text: string, batch: Criterion[]): Record<string, number> {
    return scoreVerdicts(findJsonObject(text, "verdicts"), batch, (fault) => {
      switch (fault.kind) {
        case "no_list":
          return `judge returned no verdicts JSON object: ${JSON.stringify(text.slice(0, 200))}`;
        case "unknown":
          return `judge answered criterion "${fault.name}", expected ${quotedNames(batch)}`;
        case "repeated":
          return `judge answered "${fault.name}" more than once`;
        case "not_allowed":
          return `judge answered "${fault.verdict}" for "${fault.criterion.name}", expected one of ${
            quotedNames(fault.criterion.choices)
          }`;
        case "missing":
          return `judge gave no verdict for ${quotedNames(fault.criteria)}`;
      }
    });
  }

  async score(
    data: Record<string, unknown>,
    trace: JudgedTrace,
    signal?: AbortSignal,
  ): Promise<number> {
    const s = this.settings;
    const question = s.question_field
      ? fieldText(data, s.question_field, this.name)
      : promptText(data.prompt);
    let reference = "";
    if (s.answer_field) {
      const answer = fieldText(data, s.answer_field, this.name);
      const fence = fenceFor(answer);
      reference =
        `\nReference solution (a correct implementation of this task, for comparison):\n${fence}\n${answer}\n${fence}\n`;
    }
    const response = viewOf(trace, s.view ?? "full_trace");
    const size = s.max_criteria ?? s.criteria.length;
    const batches: Criterion[][] = [];
    for (let i = 0; i < s.criteria.length; i += size) batches.push(s.criteria.slice(i, i + size));
    const controller = new AbortController();
    const inner = signal ? AbortSignal.any([signal, controller.signal]) : controller.signal;
    const samplingArgs: SamplingArgs = s.structured_output
      ? { response_format: VERDICT_SCHEMA }
      : {};
    const results = await Promise.all(batches.map(async (batch) => {
      try {
        return await this.evaluate(
          { question, reference, response, criteria: batch.map(criterionLine).join("\n") },
          {
            trace,
            signal: inner,
            samplingArgs,
            parse: (text) => this.parseBatch(text, batch),
          },
        );
      } catch (error) {
        controller.abort(error); // one batch failing cancels the others
        throw error;
      }
    }));
    const scores = Object.assign({}, ...results) as Record<string, number>;
    if (trace.metrics) Object.assign(trace.metrics, criterionMetrics(this.name, scores));
    return weightedScore(s.criteria, scores);
  }

  override buildMessages(fields: Record<string, string>): Messages {
    const messages = super.buildMessages(fields);
    if (!this.settings.structured_output) {
      messages[0].content = `${messages[0].content}${RUBRIC_JSON_SUFFIX}`;
    }
    return messages;
  }
}
