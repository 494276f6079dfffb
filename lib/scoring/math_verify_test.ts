import assert from "node:assert/strict";
import {
  _mathWorkerStats,
  closeMathWorkers,
  mathEquivalentSync,
  normalizeMathAnswer,
  verifyMath,
} from "./math_verify.ts";

// A product whose value is undefined at every sample point, so the check falls through to
// mathjs simplify(), which needs minutes for it: a real runaway check.
const PATHOLOGICAL = "\\log(0 x)" + Array.from({ length: 30 }, (_, i) => `(x+${i})`).join("");

const EQUIVALENT: [string, string][] = [
  ["\\frac{1}{2}", "0.5"],
  ["\\frac{1}{2}", "1/2"],
  ["0.5", "1/2"],
  ["\\dfrac12", "0.5"],
  ["\\tfrac{3}{4}", "0.75"],
  ["-\\frac{3}{4}", "-.75"],
  ["18", "18.0"],
  ["18", "$18$"],
  ["18", "\\$18"],
  ["18", "18.00"],
  ["18", "18."],
  ["1000", "1,000"],
  ["1000", "1{,}000"],
  ["1000", "1\\,000"],
  ["1234567", "1,234,567"],
  ["50", "50\\%"],
  ["50\\%", "0.5"],
  ["2", "\\sqrt{4}"],
  ["2\\sqrt{2}", "\\sqrt{8}"],
  ["2x+3", "3+2x"],
  ["x^2-1", "(x-1)(x+1)"],
  ["\\pi r^2", "r^2 \\pi"],
  ["\\frac{1}{x}", "x^{-1}"],
  ["\\sin^2 x + \\cos^2 x", "1"],
  ["\\log_2 8", "3"],
  ["\\sqrt[3]{27}", "3"],
  ["\\binom{5}{2}", "10"],
  ["e^{i\\pi}", "-1"],
  ["3\\times 10^{5}", "300000"],
  ["\\alpha + \\beta", "\\beta+\\alpha"],
  ["5", "\\text{5 apples}"],
  ["5", "5\\text{ apples}"],
  ["10", "10\\text{ cm}^2"],
  ["5", "5 dollars"],
  ["30", "30^\\circ"],
  ["30", "30^{\\circ}"],
  ["5", "x = 5"],
  ["\\left( 1, 2 \\right)", "(1,2)"],
  ["\\{1,2\\}", "\\{2, 1\\}"],
  ["A", "\\text{(A)}"],
  ["12", "\\boxed{12}"],
];

const WRONG: [string, string][] = [
  ["18", "17"],
  ["x+2", "x+1"],
  ["x_1", "x_2"],
  ["0.5", "50"],
  ["\\frac{1}{3}", "0.333"],
  ["\\pi", "3.14"],
  ["1000000", "1000001"],
  ["123456789012345678901", "123456789012345678902"],
  ["100", "10\\text{ cm}^2"],
  ["(1,2)", "(2,1)"],
  ["[0,1)", "[0,1]"],
  ["A", "B"],
  ["yes", "sey"],
  ["2", "two"],
];

Deno.test("normalizeMathAnswer() strips LaTeX decoration, units and redundant digits", () => {
  assert.equal(normalizeMathAnswer("$x = \\dfrac{1}{2}$"), "\\frac{1}{2}");
  assert.equal(normalizeMathAnswer("\\left( 1, 2 \\right)"), "(1,2)");
  assert.equal(normalizeMathAnswer("18.00"), "18");
  assert.equal(normalizeMathAnswer("0.50"), "0.5");
  assert.equal(normalizeMathAnswer("1,000"), "1000");
  assert.equal(normalizeMathAnswer("50\\%"), "50");
  assert.equal(normalizeMathAnswer("90^{\\circ}"), "90");
  assert.equal(normalizeMathAnswer("\\text{5 apples}"), "5");
  assert.equal(normalizeMathAnswer("\\boxed{\\tfrac{3}{4}}"), "\\frac{3}{4}");
  assert.equal(normalizeMathAnswer("1 \\text{ and } 2"), "1and2");
});

Deno.test("mathEquivalentSync() scores equivalent forms true", () => {
  for (const [gold, pred] of EQUIVALENT) {
    assert.equal(mathEquivalentSync(gold, pred), true, `${gold} vs ${pred}`);
  }
});

Deno.test("mathEquivalentSync() scores wrong answers false", () => {
  for (const [gold, pred] of WRONG) {
    assert.equal(mathEquivalentSync(gold, pred), false, `${gold} vs ${pred}`);
  }
});

Deno.test("mathEquivalentSync() scores empty and unparsable answers false without throwing", () => {
  assert.equal(mathEquivalentSync("5", ""), false);
  assert.equal(mathEquivalentSync("5", "   "), false);
  assert.equal(mathEquivalentSync("x", "\\frac{1}{"), false);
  assert.equal(mathEquivalentSync("x", "import(x)"), false);
  assert.equal(mathEquivalentSync("x", "(".repeat(20_000) + "x" + ")".repeat(20_000)), false);
});

Deno.test("verifyMath() agrees with the sync check, in workers", async () => {
  try {
    const results = await Promise.all([
      ...EQUIVALENT.map(([g, p]) => verifyMath(g, p)),
      ...WRONG.map(([g, p]) => verifyMath(g, p)),
    ]);
    assert.deepEqual(results, [...EQUIVALENT.map(() => true), ...WRONG.map(() => false)]);
    assert.ok(_mathWorkerStats().started >= 1);
  } finally {
    closeMathWorkers();
  }
});

Deno.test("verifyMath() reuses at most two workers across calls", async () => {
  try {
    const before = _mathWorkerStats().started;
    for (let k = 0; k < 20; k++) {
      assert.equal(await verifyMath("18", `${18 + (k % 2)}`), k % 2 === 0);
    }
    await Promise.all(Array.from({ length: 20 }, () => verifyMath("1/2", "0.5")));
    assert.ok(_mathWorkerStats().started - before <= 2);
    assert.ok(_mathWorkerStats().live <= 2);
  } finally {
    closeMathWorkers();
  }
});

Deno.test("verifyMath() scores an empty pred false without starting a worker", async () => {
  const before = _mathWorkerStats().started;
  assert.equal(await verifyMath("5", ""), false);
  assert.equal(await verifyMath("5", " \n"), false);
  assert.equal(_mathWorkerStats().started, before);
});

Deno.test("verifyMath() scores an over-long pred false without starting a worker", async () => {
  const before = _mathWorkerStats().started;
  assert.equal(await verifyMath("5", "5" + " ".repeat(50_000)), false);
  assert.equal(await verifyMath("5", "5.000", { maxChars: 4 }), false);
  assert.equal(_mathWorkerStats().started, before);
});

Deno.test("verifyMath() resolves false on timeout and replaces the stuck worker", async () => {
  try {
    assert.equal(await verifyMath("1", "1"), true); // the pool is warm, so the budget is compute
    const before = _mathWorkerStats();
    const started = performance.now();
    assert.equal(await verifyMath("x", PATHOLOGICAL, { timeoutMs: 300 }), false);
    const elapsed = performance.now() - started;
    assert.ok(elapsed >= 290 && elapsed < 3000, `took ${elapsed} ms`);
    const after = _mathWorkerStats();
    assert.equal(after.timedOut, before.timedOut + 1);
    assert.equal(after.terminated, before.terminated + 1);
    assert.equal(after.live, before.live - 1);
    assert.equal(await verifyMath("\\frac{1}{2}", "0.5"), true);
  } finally {
    closeMathWorkers();
  }
});

Deno.test("verifyMath() rejects with the abort reason and stops the worker", async () => {
  try {
    assert.equal(await verifyMath("1", "1"), true); // warm, so the check is running when aborted
    const before = _mathWorkerStats();
    const controller = new AbortController();
    const pending = verifyMath("x", PATHOLOGICAL, { signal: controller.signal });
    setTimeout(() => controller.abort(new Error("stop")), 200);
    await assert.rejects(pending, /stop/);
    assert.equal(_mathWorkerStats().terminated, before.terminated + 1);
    assert.equal(_mathWorkerStats().live, before.live - 1);
    await assert.rejects(verifyMath("1", "1", { signal: controller.signal }), /stop/);
  } finally {
    closeMathWorkers();
  }
});

Deno.test("closeMathWorkers() resolves checks in flight false", async () => {
  const pending = verifyMath("x", PATHOLOGICAL);
  await new Promise((resolve) => setTimeout(resolve, 100));
  closeMathWorkers();
  assert.equal(await pending, false);
  assert.equal(_mathWorkerStats().live, 0);
});

Deno.test("verifyMath() stops idle workers after about two seconds", async () => {
  assert.equal(await verifyMath("2", "\\sqrt{4}"), true);
  assert.ok(_mathWorkerStats().live >= 1);
  await new Promise((resolve) => setTimeout(resolve, 2500));
  assert.equal(_mathWorkerStats().live, 0);
});

Deno.test("a process that used verifyMath() exits on its own once its workers are idle", async () => {
  const url = new URL("./math_verify.ts", import.meta.url).href;
  const code = `import { verifyMath } from ${JSON.stringify(url)};
console.log(await verifyMath("\\\\frac{1}{2}", "0.5"));
const answered = performance.now();
globalThis.addEventListener("unload", () => console.log(Math.round(performance.now() - answered)));`;
  const { code: exitCode, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["eval", code],
    cwd: new URL("../..", import.meta.url).pathname,
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  assert.equal(exitCode, 0, new TextDecoder().decode(stderr));
  const [answer, idleMs] = new TextDecoder().decode(stdout).trim().split("\n");
  assert.equal(answer, "true");
  // The idle timer (2 s) ends the workers, and with them the process.
  assert.ok(Number(idleMs) >= 1500 && Number(idleMs) < 6000, `exited ${idleMs} ms after answering`);
});
