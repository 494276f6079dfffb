/**
 * The synchronous math-answer check behind {@linkcode verifyMath} (see `math_verify.ts` for
 * the three tiers): normalisation, plain numbers, the symbolic comparison with mathjs, and
 * tuples, intervals, sets and lists compared element by element.
 * @module
 */

import { all, create, type MathJsInstance, type MathNode } from "npm:mathjs@^15.2.0";
import { mulberry32 } from "../random.ts";
import {
  ALLOWED_FUNCTIONS,
  ALLOWED_OPERATORS,
  CONSTANTS,
  LatexToMathjs,
  matchBrace,
} from "./latex_to_mathjs.ts";

// ---------------------------------------------------------------------------------------------
// Normalisation (tier a)

interface Normalized {
  /** Canonical form without whitespace, compared as a string. */
  text: string;
  /** The same form with whitespace kept, so LaTeX commands stay separate for parsing. */
  spaced: string;
  /** The answer carried a percent sign, which was removed. */
  percent: boolean;
}

const TEXT_COMMANDS =
  /\\(text|textbf|textit|textrm|textsf|texttt|textnormal|mbox|hbox|mathrm|mathbf|mathit|mathsf|mathtt|mathnormal|operatorname)\s*\{/g;

// Words that follow a number in mathematics rather than name a unit.
const MATH_WORDS = new Set([
  "pi",
  "sqrt",
  "sin",
  "cos",
  "tan",
  "sec",
  "csc",
  "cot",
  "log",
  "ln",
  "exp",
  "abs",
  "inf",
  "infty",
  "infinity",
]);
const SHORT_UNITS = new Set([
  "cm",
  "mm",
  "km",
  "kg",
  "mg",
  "ft",
  "yd",
  "mi",
  "hr",
  "ml",
  "oz",
  "lb",
]);

/** The content of the last `\boxed{…}` / `\fbox{…}`, or the input when there is none. */
function unwrapBoxed(s: string): string {
  const at = Math.max(s.lastIndexOf("\\boxed"), s.lastIndexOf("\\fbox"));
  if (at < 0) return s;
  let i = at + (s.startsWith("\\boxed", at) ? 6 : 5);
  while (i < s.length && /\s/.test(s[i])) i++;
  if (s[i] !== "{") return s.slice(i).replace(/\$+\s*$/, "").trim();
  const end = matchBrace(s, i);
  return end < 0 ? s : s.slice(i + 1, end);
}

/**
 * Unwraps `\text{…}`-like commands. A trailing one made only of words after something else
 * (`5\text{ apples}`, `10\text{ cm}^2`) is a unit and is dropped with its exponent.
 */
function unwrapTextCommands(s: string): string {
  for (let guard = 0; guard < 1000; guard++) {
    TEXT_COMMANDS.lastIndex = 0;
    const m = TEXT_COMMANDS.exec(s);
    if (!m) return s;
    const open = m.index + m[0].length - 1;
    const end = matchBrace(s, open);
    if (end < 0) return s.slice(0, m.index) + s.slice(open + 1);
    const content = s.slice(open + 1, end);
    const before = s.slice(0, m.index);
    let after = s.slice(end + 1);
    const exponent = /^\s*\^\s*(\{[^{}]*\}|\d)/.exec(after);
    const rest = exponent ? after.slice(exponent[0].length) : after;
    const isMathVariant = m[1].startsWith("math") || m[1] === "operatorname";
    const isUnit = /^\s*[A-Za-z][A-Za-z\s./-]*$/.test(content) && rest.trim() === "" &&
      before.trim() !== "" && !(isMathVariant && content.trim().length < 2);
    if (isUnit) {
      after = "";
      s = before.trimEnd() + after;
    } else {
      s = before + content + after;
    }
  }
  return s;
}

/** Drops unit words after a plain number: `5 apples`, `12 cm`, `3 dollars`. */
function stripUnitWords(s: string): string {
  const m =
    /^([+-]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\/\d+)?)\s+([A-Za-z][A-Za-z.]*(?:\s+[A-Za-z][A-Za-z.]*)*)$/
      .exec(s);
  if (!m) return s;
  const first = m[2].split(/\s+/)[0].replace(/\.$/, "");
  if (MATH_WORDS.has(first.toLowerCase())) return s;
  if (first.length < 3 && !SHORT_UNITS.has(first.toLowerCase())) return s;
  return m[1];
}

/** `18.00` → `18`, `0.50` → `0.5`, `.5` → `0.5`, `+3` → `3`, `-0` → `0`. */
function canonicalNumber(t: string): string {
  const m = /^([+-]?)(\d*)(?:\.(\d*))?$/.exec(t);
  if (!m || (m[2] === "" && !m[3])) return t;
  const sign = m[1] === "-" ? "-" : "";
  const int = m[2].replace(/^0+(?=\d)/, "") || "0";
  const frac = (m[3] ?? "").replace(/0+$/, "");
  const out = frac ? `${int}.${frac}` : int;
  return out === "0" ? "0" : sign + out;
}

function normalizeDetailed(input: string): Normalized {
  let s = unwrapBoxed(input.trim());
  s = s.replace(/[\u2212\u2013\u2014]/g, "-")
    .replace(/×/g, "\\times ")
    .replace(/[·⋅]/g, "\\cdot ")
    .replace(/÷/g, "\\div ")
    .replace(/π/g, "\\pi ")
    .replace(/∞/g, "\\infty ")
    .replace(/√/g, "\\sqrt")
    .replace(/°/g, "^\\circ")
    .replace(/\*\*/g, "^");
  s = s.replace(/\\\$/g, "").replace(/\$/g, "");
  s = s.trim().replace(/^\\[[(]/, "").replace(/\\[\])]$/, "");
  s = s.replace(/\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])/g, "");
  s = s.replace(/\\(?:left|right)(?![A-Za-z])(\s*\.)?/g, "");
  s = s.replace(/\\[Bb]igg?[lrm]?(?![A-Za-z])/g, "");
  s = s.replace(/\\[!,:;>]/g, "").replace(/\\q?quad(?![A-Za-z])/g, " ").replace(/\\ |~/g, " ");
  s = s.replace(
    /\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\^?\s*\\degree(?![A-Za-z])/g,
    "",
  );
  let percent = false;
  s = s.replace(/\\%|%|\\percent(?![A-Za-z])/g, () => {
    percent = true;
    return "";
  });
  s = unwrapTextCommands(s);
  s = s.replace(/\\[dtc]frac(?![A-Za-z])/g, "\\frac")
    .replace(/\\frac\s*(\d)\s*(\d)/g, "\\frac{$1}{$2}")
    .replace(/\\frac\s*(\d)\s*\{/g, "\\frac{$1}{")
    .replace(/\\frac\s*\{([^{}]*)\}\s*(\d)/g, "\\frac{$1}{$2}")
    .replace(/\\sqrt\s*(\d)/g, "\\sqrt{$1}")
    .replace(/\{,\}/g, ",");
  s = s.trim().replace(/\s*\.$/, "");
  const assignment =
    /^(?:[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?|\\[A-Za-z]+(?:_\{?[A-Za-z0-9]+\}?)?)\s*=\s*([^=]+)$/
      .exec(s);
  if (assignment) s = assignment[1].trim();
  s = stripUnitWords(s);
  if (/^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$/.test(s.replace(/\s+/g, ""))) s = s.replace(/[,\s]/g, "");
  while (s.startsWith("{") && matchBrace(s, 0) === s.length - 1) s = s.slice(1, -1).trim();
  const spaced = s.trim();
  return { text: canonicalNumber(spaced.replace(/\s+/g, "")), spaced, percent };
}

/**
 * Canonical form of a math answer for string comparison: unwraps `\boxed{}`, drops `$`,
 * `\left`/`\right`, LaTeX spacing, whitespace, `\text{}` wrappers (and a trailing unit),
 * degree signs, the percent sign, a leading `x =` assignment and a final period; turns
 * `\dfrac`/`\tfrac` into `\frac`, `1,000` into `1000` and `18.00` into `18`.
 *
 * @param s The answer as written by the dataset or the model.
 * @returns The canonical form; equal forms mean equal answers, different forms may still be.
 * @example
 * ```ts
 * normalizeMathAnswer("$x = \\dfrac{1}{2}$"); // "\\frac{1}{2}"
 * ```
 */
export function normalizeMathAnswer(s: string): string {
  return normalizeDetailed(s).text;
}

// ---------------------------------------------------------------------------------------------
// Plain numbers (tier b)

interface PlainNumber {
  value: number;
  /** Set for integer literals, which are compared exactly. */
  int: bigint | null;
}

const NUM = String.raw`\d+(?:\.\d+)?`;
const SLASH_FRACTION = new RegExp(String.raw`^([+-]?)(${NUM})/([+-]?${NUM})$`);
const LATEX_FRACTION = new RegExp(String.raw`^([+-]?)\\frac\{([+-]?${NUM})\}\{([+-]?${NUM})\}$`);

function parsePlainNumber(t: string): PlainNumber | null {
  if (/^[+-]?\d+$/.test(t)) return { value: Number(t), int: BigInt(t) };
  if (/^[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:e[+-]?\d+)?$/i.test(t)) {
    return { value: Number(t), int: null };
  }
  const m = SLASH_FRACTION.exec(t) ?? LATEX_FRACTION.exec(t);
  if (!m) return null;
  const den = Number(m[3]);
  if (den === 0) return null;
  return { value: (m[1] === "-" ? -1 : 1) * Number(m[2]) / den, int: null };
}

function closeRelative(a: number, b: number, rel: number, abs = 0): boolean {
  if (a === b) return true;
  if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
  return Math.abs(a - b) <= abs + rel * Math.max(Math.abs(a), Math.abs(b));
}

function withPercentVariants(n: PlainNumber, percent: boolean): PlainNumber[] {
  return percent ? [n, { value: n.value / 100, int: null }] : [n];
}

function plainNumbersEqual(g: Normalized, gn: PlainNumber, p: Normalized, pn: PlainNumber) {
  for (const a of withPercentVariants(gn, g.percent)) {
    for (const b of withPercentVariants(pn, p.percent)) {
      if (
        a.int !== null && b.int !== null ? a.int === b.int : closeRelative(a.value, b.value, 1e-6)
      ) {
        return true;
      }
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Symbolic comparison (tier c)

let mathInstance: MathJsInstance | undefined;
function mathjs(): MathJsInstance {
  // A private instance: nothing a model writes can reach import() or createUnit() anyway,
  // because parsed trees are checked against a whitelist before they are evaluated.
  return mathInstance ??= create(all);
}

interface ParsedExpression {
  node: MathNode;
  variables: Set<string>;
}

function parseExpression(latex: string, percent: boolean): ParsedExpression {
  const math = mathjs();
  const source = LatexToMathjs.convert(latex);
  const node = math.parse(percent ? `(${source}) / 100` : source);
  const variables = new Set<string>();
  const check = (n: MathNode): void => {
    if (math.isConstantNode(n)) {
      if (typeof n.value !== "number") throw new TypeError("Non-numeric constant");
    } else if (math.isSymbolNode(n)) {
      if (!CONSTANTS.has(n.name)) variables.add(n.name);
    } else if (math.isOperatorNode(n)) {
      if (!ALLOWED_OPERATORS.has(n.fn)) throw new TypeError(`Operator "${n.op}" is not allowed`);
      n.args.forEach(check);
    } else if (math.isParenthesisNode(n)) {
      check(n.content);
    } else if (math.isFunctionNode(n)) {
      if (!math.isSymbolNode(n.fn) || !ALLOWED_FUNCTIONS.has(n.fn.name)) {
        throw new TypeError("Function is not allowed");
      }
      n.args.forEach(check);
    } else {
      throw new TypeError(`Node "${n.type}" is not allowed`);
    }
  };
  check(node);
  return { node, variables };
}

interface ComplexValue {
  re: number;
  im: number;
}

function evaluate(node: MathNode, scope: Record<string, number>): ComplexValue | null {
  const math = mathjs();
  const value: unknown = node.compile().evaluate({ ...scope });
  if (typeof value === "number") return { re: value, im: 0 };
  if (math.isComplex(value)) return { re: value.re, im: value.im };
  return null;
}

function closeComplex(a: ComplexValue, b: ComplexValue, rel: number, abs: number): boolean {
  if (a.re === b.re && a.im === b.im) return true;
  const diff = Math.hypot(a.re - b.re, a.im - b.im);
  if (!Number.isFinite(diff)) return false;
  return diff <= abs + rel * Math.max(Math.hypot(a.re, a.im), Math.hypot(b.re, b.im));
}

function isFiniteComplex(v: ComplexValue | null): v is ComplexValue {
  return v !== null && Number.isFinite(v.re) && Number.isFinite(v.im);
}

/** Deterministic pseudo-random numbers, so a verdict never flips between runs. */
const sampler = mulberry32;

const MAX_VARIABLES = 8;
const SAMPLE_POINTS = 6;
const MIN_VALID_POINTS = 3;
// simplify() can take exponential time; larger expressions that sampling cannot decide are
// reported as not equivalent rather than left to the timeout.
const MAX_SIMPLIFY_NODES = 200;

function nodeCount(node: MathNode): number {
  let count = 0;
  node.traverse(() => count++);
  return count;
}

function expressionsEqual(a: ParsedExpression, b: ParsedExpression): boolean {
  const variables = [...new Set([...a.variables, ...b.variables])];
  if (variables.length > MAX_VARIABLES) return false;
  if (variables.length === 0) {
    const va = evaluate(a.node, {});
    const vb = evaluate(b.node, {});
    return va !== null && vb !== null && closeComplex(va, vb, 1e-6, 1e-12);
  }
  const random = sampler(0x5eed);
  let valid = 0;
  for (let k = 0; k < SAMPLE_POINTS; k++) {
    const scope: Record<string, number> = {};
    for (const v of variables) scope[v] = 0.3 + 2 * random();
    const va = evaluate(a.node, scope);
    const vb = evaluate(b.node, scope);
    if (!isFiniteComplex(va) || !isFiniteComplex(vb)) continue;
    if (!closeComplex(va, vb, 1e-7, 1e-9)) return false;
    valid++;
  }
  if (valid >= MIN_VALID_POINTS) return true;
  // Sampling could not decide (undefined at every point): ask the simplifier.
  if (nodeCount(a.node) + nodeCount(b.node) > MAX_SIMPLIFY_NODES) return false;
  const math = mathjs();
  const difference = math.simplify(new math.OperatorNode("-", "subtract", [a.node, b.node]));
  return math.isConstantNode(difference) && difference.value === 0;
}

function symbolicEqual(g: Normalized, p: Normalized): boolean {
  const golds = [parseExpression(g.spaced, false)];
  if (g.percent) golds.push(parseExpression(g.spaced, true));
  const preds = [parseExpression(p.spaced, false)];
  if (p.percent) preds.push(parseExpression(p.spaced, true));
  return golds.some((a) => preds.some((b) => expressionsEqual(a, b)));
}

// ---------------------------------------------------------------------------------------------
// Tuples, intervals, sets and lists

interface AnswerList {
  /** "ordered" for tuples and intervals (brackets must agree), "unordered" for sets and lists. */
  kind: "ordered" | "unordered";
  open: string;
  close: string;
  items: string[];
}

const MAX_LIST_ITEMS = 100;

function splitList(spaced: string): AnswerList | null {
  let s = spaced.trim();
  let open = "";
  let close = "";
  const opener = /^(\\\{|\(|\[)/.exec(s);
  const closer = /(\\\}|\)|\])$/.exec(s);
  if (opener && closer) {
    // The first bracket must close only at the very end for the whole answer to be one list.
    let depth = 0;
    let wraps = true;
    for (let i = 0; i < s.length; i++) {
      const c = s[i];
      if (c === "\\" && (s[i + 1] === "{" || s[i + 1] === "}")) {
        depth += s[i + 1] === "{" ? 1 : -1;
        i++;
      } else if ("([{".includes(c)) depth++;
      else if (")]}".includes(c)) depth--;
      if (depth === 0 && i < s.length - 1) {
        wraps = false;
        break;
      }
    }
    if (wraps) {
      open = opener[1];
      close = closer[1];
      s = s.slice(open.length, s.length - close.length);
    }
  }
  const items: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === "\\") {
      if (s[i + 1] === "{") depth++;
      else if (s[i + 1] === "}") depth--;
      i++;
    } else if ("([{".includes(c)) depth++;
    else if (")]}".includes(c)) depth--;
    else if (c === "," && depth === 0) {
      items.push(s.slice(start, i).trim());
      start = i + 1;
    }
  }
  items.push(s.slice(start).trim());
  if (items.length < 2 || items.length > MAX_LIST_ITEMS) {
    // A one-element set still needs its braces compared.
    if (open === "\\{" && items.length === 1) return { kind: "unordered", open, close, items };
    return null;
  }
  const ordered = open === "(" || open === "[";
  return { kind: ordered ? "ordered" : "unordered", open, close, items };
}

function listsEqual(g: AnswerList, p: AnswerList, depth: number): boolean {
  if (g.kind !== p.kind || g.items.length !== p.items.length) return false;
  if (g.kind === "ordered") {
    return g.open === p.open && g.close === p.close &&
      g.items.every((item, k) => equivalent(item, p.items[k], depth + 1));
  }
  const unused = [...p.items];
  for (const item of g.items) {
    const k = unused.findIndex((candidate) => equivalent(item, candidate, depth + 1));
    if (k < 0) return false;
    unused.splice(k, 1);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The check

function equivalent(gold: string, pred: string, depth: number): boolean {
  const g = normalizeDetailed(gold);
  const p = normalizeDetailed(pred);
  if (p.text === "" || g.text === "") return false;
  if (g.text === p.text) return true;
  const gn = parsePlainNumber(g.text);
  const pn = parsePlainNumber(p.text);
  if (gn && pn) return plainNumbersEqual(g, gn, p, pn);
  if (depth < 4) {
    const gl = splitList(g.spaced);
    const pl = splitList(p.spaced);
    if (gl || pl) return gl !== null && pl !== null && listsEqual(gl, pl, depth);
  }
  return symbolicEqual(g, p);
}

/**
 * Whether `pred` is mathematically equivalent to `gold`, decided in this thread (see the module
 * doc for the tiers). Never throws: anything it cannot parse is not equivalent. Prefer
 * {@linkcode verifyMath}, which bounds the time a pathological answer can take.
 *
 * @param gold The reference answer.
 * @param pred The model's answer, already extracted (for example from `\boxed{}`).
 * @returns `true` when the answers are equivalent.
 * @example
 * ```ts
 * mathEquivalentSync("2x+3", "3+2x"); // true
 * ```
 */
export function mathEquivalentSync(gold: string, pred: string): boolean {
  try {
    if (pred.trim() === "") return false;
    return equivalent(gold, pred, 0);
  } catch {
    return false;
  }
}
