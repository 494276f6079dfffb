import assert from "node:assert/strict";
import { terminalJson, terminalLines, terminalText } from "./terminal.ts";

Deno.test("terminalText() drops escape sequences whole and shows other control characters as text", () => {
  assert.equal(
    terminalText("ok\x1b[2J\x1b]0;pwned\x07 run\x1b[31m red\x00\x7f\x9b"),
    "ok run red\\x00\\x7f\\x9b",
  );
  // A line of its own cannot be faked: newline, carriage return and tab become text.
  assert.equal(terminalText("a\nb\rc\td"), "a\\x0ab\\x0dc\\x09d");
  // Bidirectional overrides would reorder what the terminal shows.
  assert.equal(terminalText("x\u202ey"), "x\\u202ey");
  // An OSC 8 link and a C1 string (DCS) go as a whole, up to their terminator.
  assert.equal(terminalText("\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"), "click");
  assert.equal(terminalText("a\x90q$\x9cb"), "ab");
});

Deno.test("terminalText() shows a value that is not a string as its JSON, stripped the same way", () => {
  assert.equal(terminalText(3), "3");
  assert.equal(terminalText({ k: "v\x1b[2J" }), '{"k":"v\\u001b[2J"}');
  assert.equal(terminalText(undefined), "undefined");
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  assert.equal(terminalText(cyclic), "[object Object]");
});

Deno.test("terminalLines() keeps newlines and tabs and strips everything else", () => {
  assert.equal(
    terminalLines("tab\tand newline\n kept\x1b]0;pwned\x07\x1b[2J\r"),
    "tab\tand newline\n kept\\x0d",
  );
});

Deno.test("terminalJson() escapes the controls JSON leaves raw and still parses to the same value", () => {
  const value = { k: "c1\x9b2J\x1b[2J bidi\u202e del\x7f" };
  const text = terminalJson(value);
  assert.equal(text, '{"k":"c1\\u009b2J\\u001b[2J bidi\\u202e del\\u007f"}');
  assert.deepEqual(JSON.parse(text), value);
});
