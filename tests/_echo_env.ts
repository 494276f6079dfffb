/**
 * The echo environment of lib/serve/server_test.ts and lib/eval/evaluate_test.ts: "echo-test", whose
 * answer to question `qN` is `aN` (q0 … q5), scored 1 on an exact match.
 * @module
 */
import { type MultiTurnEnvOptions, SingleTurnEnv } from "../lib/legacy/multi_turn.ts";
import { contentText } from "../lib/messages.ts";
import { Rubric } from "../lib/scoring/rubric.ts";

const QUESTIONS = ["q0", "q1", "q2", "q3", "q4", "q5"];

/** Environment options other than the dataset; `rubric` replaces the exact-match one. */
export type EchoEnvOptions = Omit<MultiTurnEnvOptions, "maxTurns" | "evalDataset">;

/** The echo environment with its first `questions` questions (at most six; default all). */
export function echoEnv(questions = QUESTIONS.length, options: EchoEnvOptions = {}): SingleTurnEnv {
  return new SingleTurnEnv({
    envId: "echo-test",
    ...options,
    evalDataset: QUESTIONS.slice(0, questions).map((q) => ({
      question: q,
      answer: q.replace("q", "a"),
    })),
    rubric: options.rubric ?? new Rubric({
      funcs: [function correct({ completion, answer }) {
        return contentText(completion.at(-1)?.content ?? "") === answer;
      }],
    }),
  });
}
