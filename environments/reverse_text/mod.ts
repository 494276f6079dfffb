/**
 * reverse-text: reverse a sentence character by character, inside `<reversed_text>` tags.
 * Reward: longest-common-subsequence ratio between the parsed answer and the truth.
 * @module
 */
import { Rubric, SingleTurnEnv, XMLParser } from "../../mod.ts";
import { SENTENCES } from "./sentences.ts";

/** Defaults `vf eval reverse-text` uses when -n / -r are not given. */
export const evalDefaults = { num_examples: 10, rollouts_per_example: 3 };

const SYSTEM_PROMPT = `Reverse the text you are given, character by character.
Answer in this format:
<reversed_text>
...the reversed text...
</reversed_text>`;

/** Similarity in [0, 1]: 2·LCS / (|a| + |b|). */
export function lcsRatio(a: string, b: string): number {
  if (!a.length && !b.length) return 1;
  let prev = new Array(b.length + 1).fill(0);
  for (let i = 1; i <= a.length; i++) {
    const cur = new Array(b.length + 1).fill(0);
    for (let j = 1; j <= b.length; j++) {
      cur[j] = a[i - 1] === b[j - 1] ? prev[j - 1] + 1 : Math.max(prev[j], cur[j - 1]);
    }
    prev = cur;
  }
  return (2 * prev[b.length]) / (a.length + b.length);
}

/** Build the environment. */
export function loadEnvironment(args: Record<string, unknown> = {}): SingleTurnEnv {
  const parser = new XMLParser(["reversed_text"], { answerField: "reversed_text" });
  const rows = SENTENCES.map((text) => ({
    question: text,
    answer: [...text].reverse().join(""),
    task: "reverse-text",
  }));
  const rubric = new Rubric({
    funcs: [
      function lcs_reward({ completion, answer, parser }) {
        const got = parser.parseAnswer(completion) ?? "";
        return lcsRatio(got, answer);
      },
    ],
    parser,
  });
  rubric.addMetric(parser.getFormatRewardFunc(), 0, "format_reward");
  return new SingleTurnEnv({
    evalDataset: rows,
    systemPrompt: SYSTEM_PROMPT,
    parser,
    rubric,
    envId: "reverse-text",
    envArgs: args,
  });
}
