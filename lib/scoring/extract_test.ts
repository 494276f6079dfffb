import assert from "node:assert/strict";
import {
  BOXED_SYSTEM_PROMPT,
  extractBoxedAnswer,
  extractHashAnswer,
  THINK_BOXED_SYSTEM_PROMPT,
} from "./extract.ts";

Deno.test("extractBoxedAnswer() returns the content of a single box", () => {
  assert.equal(extractBoxedAnswer("The answer is \\boxed{42}."), "42");
});

Deno.test("extractBoxedAnswer() keeps nested braces balanced", () => {
  assert.equal(extractBoxedAnswer("so \\boxed{\\frac{1}{2}} done"), "\\frac{1}{2}");
  assert.equal(extractBoxedAnswer("\\boxed{{a}{b{c}}}"), "{a}{b{c}}");
});

Deno.test("extractBoxedAnswer() takes the last box when there are several", () => {
  assert.equal(extractBoxedAnswer("first \\boxed{1}, then \\boxed{2}"), "2");
});

Deno.test("extractBoxedAnswer() returns an empty string for an empty box", () => {
  assert.equal(extractBoxedAnswer("\\boxed{}"), "");
  assert.equal(extractBoxedAnswer("\\boxed{}", { strict: true }), "");
});

Deno.test("extractBoxedAnswer() keeps whitespace inside the box", () => {
  assert.equal(extractBoxedAnswer("\\boxed{ x = 3 }"), " x = 3 ");
});

Deno.test("extractBoxedAnswer() returns the original text when there is no box", () => {
  assert.equal(extractBoxedAnswer("just 42"), "just 42");
  assert.equal(extractBoxedAnswer(""), "");
});

Deno.test("extractBoxedAnswer() returns an empty string without a box when strict", () => {
  assert.equal(extractBoxedAnswer("just 42", { strict: true }), "");
});

Deno.test("extractBoxedAnswer() returns the original text when the braces never balance", () => {
  const text = "answer \\boxed{\\frac{1}{2}";
  assert.equal(extractBoxedAnswer(text), text);
  assert.equal(extractBoxedAnswer(text, { strict: true }), "");
});

Deno.test("extractBoxedAnswer() does not fall back to an earlier box when the last is unbalanced", () => {
  const text = "\\boxed{1} and \\boxed{2";
  assert.equal(extractBoxedAnswer(text), text);
  assert.equal(extractBoxedAnswer(text, { strict: true }), "");
});

Deno.test("extractBoxedAnswer() ignores a \\boxed without an opening brace", () => {
  assert.equal(extractBoxedAnswer("\\boxed 5"), "\\boxed 5");
  assert.equal(extractBoxedAnswer("\\boxed{3} then \\boxed 5"), "3");
});

Deno.test("extractBoxedAnswer() handles text outside the Basic Multilingual Plane", () => {
  assert.equal(extractBoxedAnswer("😀 \\boxed{😀{x}} 😀"), "😀{x}");
});

Deno.test("extractBoxedAnswer() works as a one-argument extract function", () => {
  const extract: (text: string) => string = extractBoxedAnswer;
  assert.equal(extract("\\boxed{7}"), "7");
});

Deno.test("extractHashAnswer() returns the trimmed text after ####", () => {
  assert.equal(extractHashAnswer("48 + 24 = 72\n#### 72"), "72");
});

Deno.test("extractHashAnswer() stops at the next ####", () => {
  assert.equal(extractHashAnswer("work #### 5 #### 6"), "5");
});

Deno.test("extractHashAnswer() returns the text unchanged without ####", () => {
  assert.equal(extractHashAnswer("  no marker here  "), "  no marker here  ");
});

Deno.test("extractHashAnswer() returns an empty string when nothing follows ####", () => {
  assert.equal(extractHashAnswer("work ####"), "");
  assert.equal(extractHashAnswer("####   "), "");
});

Deno.test("BOXED_SYSTEM_PROMPT asks for step-by-step reasoning and a \\boxed{} answer", () => {
  assert.match(BOXED_SYSTEM_PROMPT, /step by step/);
  assert.ok(BOXED_SYSTEM_PROMPT.includes("\\boxed{}"));
  assert.ok(!BOXED_SYSTEM_PROMPT.includes("<think>"));
});

Deno.test("THINK_BOXED_SYSTEM_PROMPT adds <think> tags to the boxed prompt", () => {
  assert.match(THINK_BOXED_SYSTEM_PROMPT, /step by step/);
  assert.ok(THINK_BOXED_SYSTEM_PROMPT.includes("<think>...</think>"));
  assert.ok(THINK_BOXED_SYSTEM_PROMPT.includes("\\boxed{}"));
});
