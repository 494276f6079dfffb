/**
 * Responders for the scripted model server: a script of replies given in order, and the
 * deterministic demo model that `vf demo` serves, with the helpers they read requests by.
 * @module
 */
import {
  type ChatRequest,
  contentText,
  errorBody,
  type Reply,
  type Responder,
} from "./server_wire.ts";

/** The text of the last user message, or `""`. */
export function lastUserText(request: ChatRequest): string {
  const messages = request.body.messages;
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === "user") return contentText(messages[i].content);
  }
  return "";
}

/** The text of every system message joined by blank lines, or `""`. */
export function systemText(request: ChatRequest): string {
  return request.body.messages
    .filter((m) => m.role === "system" || m.role === "developer")
    .map((m) => contentText(m.content))
    .join("\n\n");
}

/**
 * A responder that gives `replies` in order, one per call. When they run out it errors with
 * a 500 "script exhausted", or repeats the last reply (`repeatLast`), or starts over (`loop`).
 *
 * @param replies the script
 * @param options.loop start again from the first reply; default false
 * @param options.repeatLast keep giving the last reply; default false
 */
export function scriptedResponder(
  replies: Reply[],
  options: { loop?: boolean; repeatLast?: boolean } = {},
): Responder {
  let next = 0;
  return () => {
    const i = next++;
    if (i < replies.length) return replies[i];
    if (replies.length > 0 && options.loop) return replies[i % replies.length];
    if (replies.length > 0 && options.repeatLast) return replies[replies.length - 1];
    return {
      status: 500,
      body: errorBody(
        `Script exhausted: request ${i + 1} but only ${replies.length} replies were scripted`,
        "server_error",
        "script_exhausted",
      ),
    };
  };
}

/** A uniform number in [0, 1) from a string (FNV-1a, then murmur3's finaliser). */
function unitHash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return (h >>> 0) / 0x100000000;
}

/** The longest arithmetic expression in `text` (digits joined by operators), if any. */
function findExpression(text: string): string | undefined {
  let best: string | undefined;
  for (const run of text.match(/[\d+\-*/^%().\s×÷]+/g) ?? []) {
    const candidate = run.trim().replace(/[.\s]+$/, "");
    if (!/\d\s*[-+*/^%×÷]\s*\(*\s*\d/.test(candidate)) continue;
    if (best === undefined || candidate.length > best.length) best = candidate;
  }
  return best;
}

function wrongAnswer(answer: string): string {
  const n = Number(answer.replaceAll(",", "").trim());
  if (answer.trim() !== "" && Number.isFinite(n)) return String(n + 1);
  return `not ${answer}`;
}

/** Drop one character, at a position chosen by `h`, so the text is close but not equal. */
function perturb(text: string, h: number): string {
  const chars = Array.from(text);
  if (chars.length === 0) return "x";
  chars.splice(Math.floor(h * chars.length), 1);
  return chars.join("");
}

/** Options of {@link demoResponder}. */
export interface DemoResponderOptions {
  /** The probability of answering correctly; default 0.75. */
  accuracy?: number;
  /** Changes which questions are answered correctly; default 0. */
  seed?: number;
  /** The answer key: question (the last user message's text) → answer. */
  answers?: Map<string, string> | ((question: string) => string | undefined);
}

/** The reply of {@link demoResponder} when it has no answer key for a question. */
export const DEMO_NO_ANSWER_TEXT =
  "I am vf's scripted demo model, not a language model, and I have no answer key for this question.";

/**
 * A deterministic stand-in model for `vf demo`. It is scripted, not a language model:
 *
 * - tools include `calculator` and no tool has answered yet: it calls `calculator` with the
 *   arithmetic expression found in the question; after a tool message it answers
 *   `\boxed{<tool result>}`;
 * - the system prompt mentions reversing: it answers `<reversed_text>\n…\n</reversed_text>`,
 *   reversed correctly with probability `accuracy`, else with one character dropped;
 * - the question is in `answers`: a short step-by-step text ending in `\boxed{ANSWER}`, correct
 *   with probability `accuracy`, else wrong (answer + 1 when numeric);
 * - otherwise a fixed text, {@link DEMO_NO_ANSWER_TEXT}.
 *
 * Whether an answer is correct depends only on a hash of the question, `seed` and how many
 * times this responder has seen the question before, so repeated rollouts of one question
 * vary (pass@k differs from pass@1) while a whole run is reproducible: for each question the
 * sequence of right and wrong replies is fixed, whatever order the requests arrive in.
 */
export function demoResponder(options: DemoResponderOptions = {}): Responder {
  const accuracy = options.accuracy ?? 0.75;
  const seed = options.seed ?? 0;
  const answers = options.answers;
  const lookup = (question: string): string | undefined => {
    if (answers === undefined) return undefined;
    if (typeof answers === "function") return answers(question);
    const exact = answers.get(question) ?? answers.get(question.trim());
    if (exact !== undefined) return exact;
    // The environment may have wrapped the question in instructions: take the longest key inside.
    let found: [string, string] | undefined;
    for (const [key, value] of answers) {
      if (key !== "" && question.includes(key) && (!found || key.length > found[0].length)) {
        found = [key, value];
      }
    }
    return found?.[1];
  };

  const seen = new Map<string, number>();
  return (request) => {
    const question = lastUserText(request).trim();
    const occurrence = seen.get(question) ?? 0;
    seen.set(question, occurrence + 1);
    const h = unitHash(`${seed}\u0000${question}\u0000${occurrence}`);
    const correct = h < accuracy;
    const messages = request.body.messages;

    const hasCalculator = (request.body.tools ?? []).some((tool) =>
      (tool.function?.name ?? tool.name) === "calculator"
    );
    if (hasCalculator) {
      const toolMessages = messages.filter((m) => m.role === "tool");
      if (toolMessages.length === 0) {
        return {
          content: null,
          tool_calls: [{
            name: "calculator",
            arguments: { expression: findExpression(question) ?? question },
          }],
        };
      }
      const result = contentText(toolMessages[toolMessages.length - 1].content).trim();
      return { content: `The calculator says ${result}.\n\n\\boxed{${result}}` };
    }

    if (/revers/i.test(systemText(request))) {
      const reversed = Array.from(question).reverse().join("");
      const text = correct ? reversed : perturb(reversed, unitHash(`${h}`));
      return { content: `<reversed_text>\n${text}\n</reversed_text>` };
    }

    const answer = lookup(question);
    if (answer === undefined) return { content: DEMO_NO_ANSWER_TEXT };
    const given = correct ? answer : wrongAnswer(answer);
    const brief = question.length > 80 ? `${question.slice(0, 77)}...` : question;
    return {
      content: `I am vf's scripted demo model; I look answers up rather than reason.\n` +
        `Step 1: read the question: "${brief}"\n` +
        `Step 2: work out the result: ${given}.\n\n` +
        `\\boxed{${given}}`,
    };
  };
}
