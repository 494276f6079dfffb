/**
 * Math answer equivalence for MathRubric (spec §14.4). Python `verifiers` uses `math_verify`
 * (sympy); JavaScript has no equivalent, so this module checks in three tiers, each tried only
 * when the previous one cannot decide:
 *
 * 1. string equality after {@linkcode normalizeMathAnswer};
 * 2. numeric equality of plain numbers (integers exactly, otherwise a relative tolerance of
 *    1e-6), where a percentage also matches its value divided by 100;
 * 3. a symbolic check with mathjs: both sides are converted from simple LaTeX, constant
 *    expressions are evaluated, and expressions with free variables are compared at a few
 *    fixed pseudo-random points (with `simplify((a) - (b)) == 0` when sampling cannot decide).
 *
 * Tuples, intervals, sets and bare comma lists are compared element by element.
 * {@linkcode verifyMath} runs the check in a worker under a hard timeout.
 *
 * @example
 * ```ts
 * import { closeMathWorkers, verifyMath } from "./math_verify.ts";
 * console.log(await verifyMath("\\frac{1}{2}", "0.5")); // true
 * closeMathWorkers();
 * ```
 * @module
 */

import { all, create, type MathJsInstance, type MathNode } from "npm:mathjs@^15.2.0";
import { mulberry32 } from "./random.ts";

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

/** Index of the `}` matching the `{` at `open`, skipping escaped braces; -1 if unbalanced. */
function matchBrace(s: string, open: number): number {
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    const c = s[i];
    if (c === "\\") {
      i++;
      continue;
    }
    if (c === "{") depth++;
    else if (c === "}" && --depth === 0) return i;
  }
  return -1;
}

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
// LaTeX → mathjs (tier c)

const FUNCTIONS: Record<string, string> = {
  sin: "sin",
  cos: "cos",
  tan: "tan",
  sec: "sec",
  csc: "csc",
  cot: "cot",
  arcsin: "asin",
  arccos: "acos",
  arctan: "atan",
  asin: "asin",
  acos: "acos",
  atan: "atan",
  sinh: "sinh",
  cosh: "cosh",
  tanh: "tanh",
  ln: "log",
  log: "log",
  exp: "exp",
  sqrt: "sqrt",
  abs: "abs",
};
const CONSTANT_WORDS: Record<string, string> = {
  pi: "pi",
  infty: "Infinity",
  inf: "Infinity",
  infinity: "Infinity",
};
const GREEK = new Set(
  ("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi " +
    "rho varrho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma " +
    "Upsilon Phi Psi Omega").split(" "),
);
const ALLOWED_FUNCTIONS = new Set([
  ...Object.values(FUNCTIONS),
  "nthRoot",
  "combinations",
]);
const ALLOWED_OPERATORS = new Set([
  "add",
  "subtract",
  "multiply",
  "divide",
  "pow",
  "unaryMinus",
  "unaryPlus",
  "factorial",
]);
const CONSTANTS = new Set(["pi", "e", "i", "Infinity"]);

/** Converts the LaTeX subset answers use into a mathjs expression; throws on anything else. */
class LatexToMathjs {
  #s: string;
  #i = 0;

  constructor(s: string) {
    this.#s = s;
  }

  static convert(s: string): string {
    return new LatexToMathjs(s).#expression();
  }

  #skipSpace(): void {
    while (this.#i < this.#s.length && /\s/.test(this.#s[this.#i])) this.#i++;
  }

  #expression(): string {
    const tokens: string[] = [];
    for (;;) {
      this.#skipSpace();
      if (this.#i >= this.#s.length) return tokens.join(" ");
      const c = this.#s[this.#i];
      if (c === "_") {
        this.#i++;
        const sub = this.#rawArgument();
        const last = tokens.pop();
        if (!last || !/^[A-Za-z][A-Za-z0-9_]*$/.test(last) || !/^[A-Za-z0-9]+$/.test(sub)) {
          throw new SyntaxError(`Unsupported subscript "${sub}"`);
        }
        tokens.push(`${last}_${sub}`);
      } else if (c === "^") {
        this.#i++;
        tokens.push(`^(${this.#powerArgument()})`);
      } else if (/[A-Za-z]/.test(c)) {
        const word = /[A-Za-z]+/y;
        word.lastIndex = this.#i;
        const run = word.exec(this.#s)![0];
        this.#i += run.length;
        const lower = run.toLowerCase();
        if (lower in FUNCTIONS) tokens.push(this.#applyFunction(FUNCTIONS[lower]));
        else if (lower in CONSTANT_WORDS) tokens.push(CONSTANT_WORDS[lower]);
        // A longer letter run is a word ("yes", "none"), not a product of variables.
        else if (run.length >= 3) throw new SyntaxError(`Unsupported word "${run}"`);
        else tokens.push(...run);
      } else if ("+-*/!".includes(c)) {
        this.#i++;
        tokens.push(c);
      } else {
        tokens.push(this.#atom());
      }
    }
  }

  /** One operand: a number, a letter, a `{…}` or `(…)` group, or a command with its arguments. */
  #atom(): string {
    this.#skipSpace();
    const s = this.#s;
    const c = s[this.#i];
    if (c === undefined) throw new SyntaxError("Missing operand");
    if (/[0-9.]/.test(c)) {
      const num = /[0-9]*\.?[0-9]+|[0-9]+\.?/y;
      num.lastIndex = this.#i;
      const m = num.exec(s);
      if (!m) throw new SyntaxError(`Bad number at ${this.#i}`);
      this.#i += m[0].length;
      return m[0];
    }
    if (/[A-Za-z]/.test(c)) {
      this.#i++;
      return c;
    }
    if (c === "{") return `(${LatexToMathjs.convert(this.#group("{", "}"))})`;
    if (c === "(") return `(${LatexToMathjs.convert(this.#group("(", ")"))})`;
    if (c === "\\") return this.#command();
    throw new SyntaxError(`Unsupported character "${c}"`);
  }

  /** The raw text of a balanced group starting at the cursor, without its delimiters. */
  #group(open: string, close: string): string {
    const s = this.#s;
    const start = this.#i;
    if (open === "{") {
      const end = matchBrace(s, start);
      if (end < 0) throw new SyntaxError("Unbalanced braces");
      this.#i = end + 1;
      return s.slice(start + 1, end);
    }
    let depth = 0;
    for (let i = start; i < s.length; i++) {
      if (s[i] === open) depth++;
      else if (s[i] === close && --depth === 0) {
        this.#i = i + 1;
        return s.slice(start + 1, i);
      }
    }
    throw new SyntaxError("Unbalanced parentheses");
  }

  /** A LaTeX argument as raw text: `{…}`, one command name, or one character. */
  #rawArgument(): string {
    this.#skipSpace();
    const s = this.#s;
    if (s[this.#i] === "{") return this.#group("{", "}");
    if (s[this.#i] === "\\") {
      const m = /\\[A-Za-z]+/y;
      m.lastIndex = this.#i;
      const cmd = m.exec(s);
      if (cmd) {
        this.#i += cmd[0].length;
        return cmd[0];
      }
    }
    if (this.#i >= s.length) throw new SyntaxError("Missing argument");
    return s[this.#i++];
  }

  #powerArgument(): string {
    this.#skipSpace();
    const s = this.#s;
    const c = s[this.#i];
    if (c === "{") return LatexToMathjs.convert(this.#group("{", "}"));
    if (c === "(") return LatexToMathjs.convert(this.#group("(", ")"));
    const signed = /[+-]?\d+(?:\.\d+)?/y;
    signed.lastIndex = this.#i;
    const m = signed.exec(s);
    if (m) {
      this.#i += m[0].length;
      return m[0];
    }
    return this.#atom();
  }

  /** `name` applied to the operand at the cursor, with an optional `^power` or `_base`. */
  #applyFunction(name: string): string {
    this.#skipSpace();
    let power: string | null = null;
    let base: string | null = null;
    if (this.#s[this.#i] === "^") {
      this.#i++;
      power = this.#powerArgument();
      this.#skipSpace();
    }
    if (this.#s[this.#i] === "_" && name === "log") {
      this.#i++;
      base = LatexToMathjs.convert(this.#rawArgument());
      this.#skipSpace();
    }
    const arg = this.#atom();
    const call = base === null ? `${name}(${arg})` : `log(${arg}, ${base})`;
    return power === null ? call : `(${call})^(${power})`;
  }

  #command(): string {
    const m = /\\([A-Za-z]+)/y;
    m.lastIndex = this.#i;
    const found = m.exec(this.#s);
    if (!found) {
      throw new SyntaxError(`Unsupported escape "${this.#s.slice(this.#i, this.#i + 2)}"`);
    }
    this.#i += found[0].length;
    const name = found[1];
    switch (name) {
      case "frac": {
        const num = LatexToMathjs.convert(this.#rawArgument());
        const den = LatexToMathjs.convert(this.#rawArgument());
        return `((${num}) / (${den}))`;
      }
      case "binom": {
        const n = LatexToMathjs.convert(this.#rawArgument());
        const k = LatexToMathjs.convert(this.#rawArgument());
        return `combinations(${n}, ${k})`;
      }
      case "sqrt": {
        this.#skipSpace();
        if (this.#s[this.#i] === "[") {
          const index = LatexToMathjs.convert(this.#group("[", "]"));
          const radicand = LatexToMathjs.convert(this.#rawArgument());
          return `nthRoot(${radicand}, ${index})`;
        }
        return `sqrt(${LatexToMathjs.convert(this.#rawArgument())})`;
      }
      case "cdot":
      case "times":
      case "ast":
        return "*";
      case "div":
        return "/";
      case "pi":
        return "pi";
      case "infty":
        return "Infinity";
      case "exponentialE":
        return "e";
    }
    if (name in FUNCTIONS) return this.#applyFunction(FUNCTIONS[name]);
    if (GREEK.has(name)) return `v_${name}`;
    throw new SyntaxError(`Unsupported command "\\${name}"`);
  }
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

// ---------------------------------------------------------------------------------------------
// Worker pool

/** Options for {@linkcode verifyMath}. */
export interface VerifyMathOptions {
  /** Wall-clock budget for the check once a worker has taken it, in ms. Default 5000. */
  timeoutMs?: number;
  /** A longer `pred` is not equivalent, without any work. Default 50000. */
  maxChars?: number;
  /** Rejects the call with the signal's reason and stops the worker running it. */
  signal?: AbortSignal;
}

interface Job {
  id: number;
  gold: string;
  pred: string;
  timeoutMs: number;
  signal?: AbortSignal;
  onAbort?: () => void;
  resolve(ok: boolean): void;
  reject(reason: unknown): void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  job: Job | null;
  timer?: ReturnType<typeof setTimeout>;
}

interface WorkerReply {
  id?: number;
  ok?: boolean;
  ready?: boolean;
}

const POOL_SIZE = 2;
const IDLE_MS = 2000;
// In a binary built by `bun build --compile` every bundled module shares the executable's
// import.meta.url (`file:///$bunfs/root/vf`, `B:/~BUN/root/` on Windows); the worker is a
// separate entrypoint there, at its path from the project root (scripts/compile.ts).
const WORKER_URL = /\/(\$bunfs|~BUN)\/root\//.test(import.meta.url)
  ? new URL("./lib/_math_worker.ts", import.meta.url).href
  : new URL("./_math_worker.ts", import.meta.url).href;

const slots: Slot[] = [];
const queue: Job[] = [];
let idleTimer: ReturnType<typeof setTimeout> | undefined;
let workersUnavailable = typeof Worker === "undefined";
let anyWorkerReady = false;
let nextJobId = 1;
const stats = { started: 0, terminated: 0, timedOut: 0 };

/** Lets the process exit while only this timer is pending (Deno, Node and Bun spell it apart). */
function unrefTimer(timer: ReturnType<typeof setTimeout>): void {
  if (typeof timer === "object" && timer !== null && "unref" in timer) {
    (timer as { unref(): void }).unref();
    return;
  }
  const deno = (globalThis as { Deno?: { unrefTimer?(id: number): void } }).Deno;
  deno?.unrefTimer?.(timer as unknown as number);
}

function runSync(job: Job): void {
  settle(job);
  job.resolve(mathEquivalentSync(job.gold, job.pred));
}

/** Detaches the abort listener; call before resolving or rejecting a job. */
function settle(job: Job): void {
  if (job.onAbort) job.signal?.removeEventListener("abort", job.onAbort);
}

function removeSlot(slot: Slot): void {
  clearTimeout(slot.timer);
  slot.worker.terminate();
  stats.terminated++;
  const k = slots.indexOf(slot);
  if (k >= 0) slots.splice(k, 1);
}

function spawn(): void {
  let worker: Worker;
  try {
    worker = new Worker(WORKER_URL, { type: "module" });
  } catch {
    // No worker support here (or not allowed): check in this thread, without a hard timeout.
    workersUnavailable = true;
    return;
  }
  stats.started++;
  const slot: Slot = { worker, ready: false, job: null };
  slots.push(slot);
  worker.onmessage = (event: MessageEvent<WorkerReply>) => {
    const reply = event.data;
    if (reply?.ready) {
      slot.ready = true;
      anyWorkerReady = true;
      pump();
      return;
    }
    const job = slot.job;
    if (!job || reply?.id !== job.id) return;
    clearTimeout(slot.timer);
    slot.job = null;
    settle(job);
    job.resolve(reply.ok === true);
    pump();
  };
  worker.onerror = (event: ErrorEvent) => {
    // Handled here, or the runtime would treat it as an uncaught error of the whole process.
    event.preventDefault();
    const job = slot.job;
    slot.job = null;
    removeSlot(slot);
    // A worker that never started (missing read permission, a bundle without the worker
    // file) will not start next time either: check in this thread from now on.
    if (!slot.ready && !anyWorkerReady && !workersUnavailable) {
      workersUnavailable = true;
      // Said once: a pathological answer can now block the process.
      console.warn(
        `Math worker "${WORKER_URL}" failed to start (${event.message}); checking answers in this thread without a timeout`,
      );
    }
    if (job) {
      settle(job);
      job.resolve(false);
    }
    pump();
  };
}

function pump(): void {
  if (idleTimer !== undefined) {
    clearTimeout(idleTimer);
    idleTimer = undefined;
  }
  if (workersUnavailable) {
    while (queue.length > 0) runSync(queue.shift()!);
  }
  while (queue.length > 0) {
    const slot = slots.find((s) => s.ready && s.job === null);
    if (!slot) {
      if (slots.length < Math.min(POOL_SIZE, queue.length + slots.filter((s) => s.job).length)) {
        spawn();
        if (workersUnavailable) return pump();
        continue;
      }
      break;
    }
    const job = queue.shift()!;
    slot.job = job;
    slot.timer = setTimeout(() => {
      if (slot.job !== job) return;
      // The worker may be stuck in a pathological input: it is not reused.
      stats.timedOut++;
      slot.job = null;
      removeSlot(slot);
      settle(job);
      job.resolve(false);
      pump();
    }, job.timeoutMs);
    slot.worker.postMessage({ id: job.id, gold: job.gold, pred: job.pred });
  }
  if (queue.length === 0 && slots.length > 0 && slots.every((s) => s.job === null)) {
    idleTimer = setTimeout(closeMathWorkers, IDLE_MS);
    unrefTimer(idleTimer);
  }
}

function abortJob(job: Job): void {
  const k = queue.indexOf(job);
  if (k >= 0) queue.splice(k, 1);
  const slot = slots.find((s) => s.job === job);
  if (slot) {
    slot.job = null;
    removeSlot(slot);
  }
  settle(job);
  job.reject(job.signal!.reason);
  pump();
}

/**
 * Whether `pred` is mathematically equivalent to `gold`, checked in a worker thread under a
 * hard timeout, so a pathological answer cannot block the event loop. An empty or over-long
 * `pred`, an error and a timeout all give `false`. Workers are pooled (two), reused across
 * calls and stopped after 2 s idle, so they never keep the process alive; where workers cannot
 * be created the check runs in this thread without a timeout.
 *
 * @param gold The reference answer.
 * @param pred The model's extracted answer.
 * @param options `timeoutMs` (default 5000), `maxChars` (default 50000), `signal`.
 * @returns `true` when the answers are equivalent.
 * @throws The signal's reason when `signal` aborts before the check finishes.
 * @example
 * ```ts
 * await verifyMath("1,000", "1000"); // true
 * ```
 */
export function verifyMath(
  gold: string,
  pred: string,
  options: VerifyMathOptions = {},
): Promise<boolean> {
  const { timeoutMs = 5000, maxChars = 50_000, signal } = options;
  if (signal?.aborted) return Promise.reject(signal.reason);
  if (pred.trim() === "" || pred.length > maxChars || gold.length > maxChars) {
    return Promise.resolve(false);
  }
  return new Promise<boolean>((resolve, reject) => {
    const job: Job = { id: nextJobId++, gold, pred, timeoutMs, signal, resolve, reject };
    if (signal) {
      job.onAbort = () => abortJob(job);
      signal.addEventListener("abort", job.onAbort, { once: true });
    }
    queue.push(job);
    pump();
  });
}

/**
 * Stops every math worker now. Checks still running or queued resolve `false`. Later calls to
 * {@linkcode verifyMath} start new workers.
 */
export function closeMathWorkers(): void {
  if (idleTimer !== undefined) {
    clearTimeout(idleTimer);
    idleTimer = undefined;
  }
  const pending = [...queue.splice(0), ...slots.flatMap((s) => (s.job ? [s.job] : []))];
  for (const slot of [...slots]) {
    slot.job = null;
    removeSlot(slot);
  }
  for (const job of pending) {
    settle(job);
    job.resolve(false);
  }
}

/** Worker counters for tests: started, terminated, and terminated because a check timed out. */
export function _mathWorkerStats(): {
  live: number;
  started: number;
  terminated: number;
  timedOut: number;
} {
  return { live: slots.length, ...stats };
}
