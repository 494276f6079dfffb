/**
 * Simple LaTeX (fractions, roots, powers, functions, Greek letters, implicit products)
 * converted to mathjs syntax, and the functions, operators and constants that the
 * symbolic check lets a parsed answer use. Used by `math_equivalence.ts`.
 * @module
 */

/** Index of the `}` matching the `{` at `open`, skipping escaped braces; -1 if unbalanced. */
export function matchBrace(s: string, open: number): number {
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
export const ALLOWED_FUNCTIONS = new Set([
  ...Object.values(FUNCTIONS),
  "nthRoot",
  "combinations",
]);
export const ALLOWED_OPERATORS = new Set([
  "add",
  "subtract",
  "multiply",
  "divide",
  "pow",
  "unaryMinus",
  "unaryPlus",
  "factorial",
]);
export const CONSTANTS = new Set(["pi", "e", "i", "Infinity"]);

/** Converts the LaTeX subset answers use into a mathjs expression; throws on anything else. */
export class LatexToMathjs {
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
