/**
 * calculator: arithmetic questions the model answers with the help of a `calculator`
 * tool; the final answer goes in `\boxed{}`. Shows ToolEnv with a zod-typed tool.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import {
  defineTool,
  extractBoxedAnswer,
  MaybeThinkParser,
  mulberry32,
  Rubric,
  ToolEnv,
} from "../../mod.ts";
import { evaluateArithmetic, formatNumber } from "./arith.ts";

/** Defaults `vf eval calculator` uses when -n / -r are not given. */
export const evalDefaults = { num_examples: 10, rollouts_per_example: 2 };

const SYSTEM_PROMPT =
  "Use the calculator tool for arithmetic, then give the final answer as \\boxed{NUMBER}.";

/** Deterministic arithmetic questions. */
export function makeQuestions(
  count: number,
  seed = 7,
): Array<{ question: string; answer: string }> {
  const rand = mulberry32(seed);
  const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
  const out = [];
  for (let i = 0; i < count; i++) {
    const a = int(12, 999), b = int(2, 99), c = int(1, 500);
    const ops = [
      `${a} * ${b} + ${c}`,
      `(${a} + ${c}) * ${b}`,
      `${a} * ${b} - ${c}`,
      `${a} + ${b} * ${c}`,
    ];
    const expression = ops[i % ops.length];
    out.push({
      question: `What is ${expression}?`,
      answer: formatNumber(evaluateArithmetic(expression)),
    });
  }
  return out;
}

/** Build the environment. Args: `num_examples` (default 20), `seed`, `max_turns` (default 4). */
export function loadEnvironment(args: Record<string, unknown> = {}): ToolEnv {
  const calculator = defineTool({
    name: "calculator",
    description: "Evaluate an arithmetic expression with + - * / % ^ and parentheses.",
    parameters: z.object({ expression: z.string().describe("e.g. (3 + 4) * 12") }),
    fn: ({ expression }) => formatNumber(evaluateArithmetic(expression)),
  });
  const parser = new MaybeThinkParser({
    extractFn: (t) => extractBoxedAnswer(t, { strict: true }),
  });
  const rubric = new Rubric({
    parser,
    funcs: [
      function correct_answer({ completion, answer, parser }) {
        const got = (parser.parseAnswer(completion) ?? "").replace(/[,\s]/g, "");
        return got !== "" && Number(got) === Number(answer) ? 1 : 0;
      },
    ],
  });
  return new ToolEnv({
    tools: [calculator],
    evalDataset: makeQuestions(Number(args.num_examples ?? 20), Number(args.seed ?? 7)),
    systemPrompt: SYSTEM_PROMPT,
    parser,
    rubric,
    maxTurns: Number(args.max_turns ?? 4),
    envId: "calculator",
    envArgs: args,
  });
}
