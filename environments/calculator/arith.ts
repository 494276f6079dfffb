/** A small, safe arithmetic evaluator: numbers, + - * / % ^, parentheses, unary minus. */
export function evaluateArithmetic(expression: string): number {
  const src = expression.replace(/\s+/g, "");
  let pos = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`Cannot evaluate "${expression}": ${what} at position ${pos}`);
  };
  const peek = () => src[pos];
  function primary(): number {
    if (peek() === "(") {
      pos++;
      const v = sum();
      if (peek() !== ")") fail("expected ')'");
      pos++;
      return v;
    }
    if (peek() === "-") {
      pos++;
      return -power();
    }
    if (peek() === "+") {
      pos++;
      return power();
    }
    const m = /^\d+(\.\d+)?|^\.\d+/.exec(src.slice(pos));
    if (!m) fail(peek() === undefined ? "unexpected end" : `unexpected "${peek()}"`);
    pos += m![0].length;
    return Number(m![0]);
  }
  function power(): number {
    const base = primary();
    if (peek() === "^") {
      pos++;
      return base ** power();
    }
    return base;
  }
  function product(): number {
    let v = power();
    while (peek() === "*" || peek() === "/" || peek() === "%") {
      const op = src[pos++];
      const r = power();
      if ((op === "/" || op === "%") && r === 0) fail("division by zero");
      v = op === "*" ? v * r : op === "/" ? v / r : v % r;
    }
    return v;
  }
  function sum(): number {
    let v = product();
    while (peek() === "+" || peek() === "-") {
      const op = src[pos++];
      const r = product();
      v = op === "+" ? v + r : v - r;
    }
    return v;
  }
  if (!src) fail("empty expression");
  const value = sum();
  if (pos < src.length) fail(`unexpected "${peek()}"`);
  return value;
}

/** Format a result without float noise: integers plain, others to 10 significant digits. */
export function formatNumber(value: number): string {
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(10)));
}
