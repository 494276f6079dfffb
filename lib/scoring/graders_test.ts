import assert from "node:assert/strict";
import { closeMathWorkers } from "./math_verify.ts";
import {
  compareStdout,
  parsePytestOutcomes,
  readAnswerFileOrLastReply,
  verifyBoxedMathAnswer,
} from "./graders.ts";

Deno.test("compareStdout(): exact, then lines, then tokens, then numbers within an absolute tolerance", () => {
  const cases: Array<[string, string, boolean]> = [
    ["hello   world\n", "hello world\n", true],
    ["a\n\n  b  \n", "a\nb", true],
    ["1.0001 2.0\n", "1.0002 2.0009\n", true],
    ["1 2", "1 2.001", true],
    ["1 2", "1 2.002", false],
    ["1000000", "1000000.5", false],
    ["1e3", "1000", true],
    ["-0", "0", true],
    ["1 a", "1.0 a", false],
    ["NaN", "nan", false],
    ["nan", "nan", true],
    ["", "", true],
    [" ", "\n", true],
    ["1 2", "1", false],
    ["0x1", "1", false],
    ["+1", "1", true],
    [".5", "0.5", true],
    ["1.", "1", true],
    ["Infinity", "1e999", false],
  ];
  for (const [a, e, want] of cases) assert.equal(compareStdout(a, e), want, JSON.stringify([a, e]));
  assert.equal(compareStdout("1 2", "1 2.05", { tolerance: 0.1 }), true);
});

Deno.test("parsePytestOutcomes(): summary lines, ANSI colours, reasons dropped, brackets kept, verbose lines ignored", () => {
  const output = [
    "============================= short test summary info ==============================",
    "\x1b[32mPASSED\x1b[0m tests/test_mod.py::test_ok",
    "PASSED tests/test_mod.py::test_dash - kept",
    "FAILED tests/test_mod.py::test_param[a - b] - assert left - right",
    "FAILED tests/test_mod.py::test_h[x - y - z] - boom - bang",
    "FAILED tests/test_mod.py::test_k[1 2] - err",
    "ERROR tests/test_mod.py::test_setup - fixture missing",
    "XFAIL tests/test_mod.py::test_xfail - known bug - still tracked",
    "XPASS tests/test_mod.py::test_xpass - unexpectedly passed",
    "SKIPPED tests/test_mod.py::test_skip",
    "SKIPPED [1] tests/test_mod.py:10: not on linux",
    "tests/test_mod.py::test_verbose PASSED [ 50%]",
    "passed tests/test_mod.py::test_lower",
    "FAILED tests/test_mod.py::test_ok - flaky rerun",
  ].join("\n");
  assert.deepEqual(parsePytestOutcomes(output), {
    "tests/test_mod.py::test_ok": "FAILED",
    "tests/test_mod.py::test_dash - kept": "PASSED",
    "tests/test_mod.py::test_param[a - b]": "FAILED",
    "tests/test_mod.py::test_h[x - y - z]": "FAILED",
    "tests/test_mod.py::test_k[1 2]": "FAILED",
    "tests/test_mod.py::test_setup": "ERROR",
    "tests/test_mod.py::test_xfail": "XFAIL",
    "tests/test_mod.py::test_xpass": "XPASS",
    "tests/test_mod.py::test_skip": "SKIPPED",
  });
  assert.deepEqual(parsePytestOutcomes(""), {});
  assert.deepEqual(parsePytestOutcomes(null), {});
});

Deno.test("verifyBoxedMathAnswer(): the last boxed answer after reasoning, equivalent forms, and 0 for anything it cannot check", async () => {
  try {
    assert.equal(await verifyBoxedMathAnswer("so \\boxed{\\frac{1}{2}}", "0.5"), 1);
    assert.equal(
      await verifyBoxedMathAnswer("<think>\\boxed{3}</think> \\boxed{2}", "\\boxed{2}"),
      1,
    );
    assert.equal(await verifyBoxedMathAnswer("<think>\\boxed{2}", "2"), 0);
    assert.equal(await verifyBoxedMathAnswer("2", "2"), 0); // no box: nothing to check
    assert.equal(await verifyBoxedMathAnswer("\\boxed{3}", "2"), 0);
    assert.equal(await verifyBoxedMathAnswer("", "2"), 0);
  } finally {
    closeMathWorkers();
  }
});

Deno.test("readAnswerFileOrLastReply(): a non-empty file wins, else the last reply, trimmed", async () => {
  const files: Record<string, string> = { "/a.txt": "  42\n", "/empty.txt": " \n" };
  const runtime = {
    read(path: string) {
      if (!(path in files)) return Promise.reject(new Error("no such file"));
      return Promise.resolve(new TextEncoder().encode(files[path]));
    },
  };
  const trace = {
    messages: [{ role: "user", content: "q" }, { role: "assistant", content: " 7 \n" }],
  };
  assert.equal(await readAnswerFileOrLastReply(runtime, "/a.txt", trace), "42");
  assert.equal(await readAnswerFileOrLastReply(runtime, "/empty.txt", trace), "7");
  assert.equal(await readAnswerFileOrLastReply(runtime, "/missing.txt", trace), "7");
});
