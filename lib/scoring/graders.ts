/**
 * Helpers graders of existing benchmarks reach for: comparing program output with the
 * expected output, reading pytest's outcomes, checking a boxed math answer, and reading an
 * answer from a file or else the agent's last reply.
 *
 * ```ts
 * compareStdout("1.0001 2.0\n", "1.0002 2.0009\n"); // true (within 1e-3)
 * parsePytestOutcomes("FAILED tests/t.py::test_a - assert 1 == 2"); // { "tests/t.py::test_a": "FAILED" }
 * ```
 * @module
 */
import { extractBoxedAnswer } from "./extract.ts";
import { verifyMath } from "./math_verify.ts";

const DECIMAL = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;

/**
 * Whether a program's output matches the expected output, tried in order: equal after
 * trimming; equal non-blank lines (each trimmed); equal whitespace-separated tokens; the
 * same number of tokens, every one a finite decimal number on both sides, each pair within
 * `tolerance` (absolute, inclusive; default 1e-3).
 */
export function compareStdout(
  actual: string,
  expected: string,
  options: { tolerance?: number } = {},
): boolean {
  if (actual.trim() === expected.trim()) return true;
  const lines = (s: string) => s.split("\n").map((l) => l.trim()).filter(Boolean);
  const a = lines(actual);
  const e = lines(expected);
  if (a.length === e.length && a.every((l, i) => l === e[i])) return true;
  const tokens = (s: string) => s.split(/\s+/).filter(Boolean);
  const at = tokens(actual);
  const et = tokens(expected);
  if (at.length === et.length && at.every((t, i) => t === et[i])) return true;
  if (at.length === 0 || at.length !== et.length) return false;
  if (![...at, ...et].every((t) => DECIMAL.test(t))) return false;
  const tolerance = options.tolerance ?? 1e-3;
  return at.every((t, i) => {
    const x = Number(t);
    const y = Number(et[i]);
    return Number.isFinite(x) && Number.isFinite(y) && Math.abs(x - y) <= tolerance + 1e-12;
  });
}

/** A pytest outcome. */
export type PytestOutcome = "PASSED" | "FAILED" | "ERROR" | "SKIPPED" | "XFAIL" | "XPASS";

const OUTCOMES = new Set<string>(["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"]);

function balanced(s: string): boolean {
  return (s.match(/\[/g)?.length ?? 0) === (s.match(/\]/g)?.length ?? 0);
}

/**
 * Test outcomes from pytest's output (`-rA` short summary lines, `OUTCOME node_id`): node id
 * → outcome. ANSI colours are removed; a ` - reason` after a failure is dropped (a
 * parametrized id may itself hold ` - ` inside its brackets); verbose lines (`id PASSED`)
 * and `SKIPPED [1] file:line: reason` lines are ignored; a later line for the same id wins.
 */
export function parsePytestOutcomes(
  output: string | null | undefined,
): Record<string, PytestOutcome> {
  const out: Record<string, PytestOutcome> = {};
  if (!output) return out;
  // deno-lint-ignore no-control-regex
  const plain = output.replace(/\x1b\[[0-9;]*[A-Za-z]/g, "");
  for (const raw of plain.split("\n")) {
    const line = raw.trim();
    const m = /^(\S+)\s+(.+)$/.exec(line);
    if (!m || !OUTCOMES.has(m[1])) continue;
    const outcome = m[1] as PytestOutcome;
    let id = m[2];
    if (outcome === "SKIPPED" && id.startsWith("[")) continue;
    if (outcome !== "PASSED" && outcome !== "SKIPPED") {
      const parts = id.split(" - ");
      for (let n = 1; n <= parts.length; n++) {
        const prefix = parts.slice(0, n).join(" - ");
        if (balanced(prefix)) {
          id = prefix;
          break;
        }
      }
    }
    out[id.trimEnd()] = outcome;
  }
  return out;
}

/**
 * 1 when the last `\boxed{...}` of `response` (after any reasoning) is mathematically the
 * same as `answer` (its boxed part, if boxed), else 0; a check that fails or passes its time
 * limit (default 5 s) is 0.
 */
export async function verifyBoxedMathAnswer(
  response: string | null | undefined,
  answer: string | null | undefined,
  options: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<number> {
  if (!response || !answer) return 0;
  if (response.includes("<think>") && !response.includes("</think>")) return 0;
  const close = response.lastIndexOf("</think>");
  const body = close >= 0 ? response.slice(close + "</think>".length) : response;
  const predicted = extractBoxedAnswer(body, { strict: true }).trim();
  const gold = (extractBoxedAnswer(answer, { strict: true }) || answer).trim();
  if (!predicted || !gold) return 0;
  try {
    return await verifyMath(gold, predicted, {
        timeoutMs: options.timeoutMs ?? 5000,
        signal: options.signal,
      })
      ? 1
      : 0;
  } catch {
    return 0;
  }
}

/** Something a file can be read from (a sandbox runtime). */
export interface FileReader {
  read(path: string, options?: { maxBytes?: number }): Promise<Uint8Array>;
}

/**
 * The answer a task grades: the trimmed text of `path` in the sandbox when it holds any,
 * else the agent's last reply (trimmed). A missing or unreadable file falls back too.
 */
export async function readAnswerFileOrLastReply(
  runtime: FileReader,
  path: string,
  trace: { messages: Array<{ role: string; content?: unknown }> },
): Promise<string> {
  try {
    const text = new TextDecoder().decode(await runtime.read(path)).trim();
    if (text) return text;
  } catch {
    // no file: the reply is the answer
  }
  const last = [...trace.messages].reverse().find((m) => m.role === "assistant");
  const c = last?.content;
  if (typeof c === "string") return c.trim();
  if (Array.isArray(c)) return c.map((p) => String(p?.text ?? "")).join("").trim();
  return "";
}
