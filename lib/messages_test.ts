import assert from "node:assert/strict";
import {
  clone,
  contentText,
  normalizeMessages,
  normalizeToolCall,
  normalizeToolDefs,
} from "./messages.ts";
import type { ContentPart } from "./types.ts";

// ---- normalizeMessages ------------------------------------------------------------------

Deno.test("normalizeMessages() turns a string into one text message", () => {
  assert.deepEqual(normalizeMessages("Complete this: 1, 2, 3,"), [
    { role: "text", content: "Complete this: 1, 2, 3," },
  ]);
});

Deno.test("normalizeMessages() passes messages with role and content through unchanged", () => {
  const messages = [
    { role: "system", content: "be brief" },
    {
      role: "user",
      content: [{ type: "text", text: "hi" }, { type: "image_url", image_url: { url: "data:x" } }],
    },
    { role: "assistant", content: "hello", reasoning_content: "thinking" },
    { role: "tool", tool_call_id: "c1", content: "42" },
    { role: "text", content: "raw" },
  ];
  assert.deepEqual(normalizeMessages(messages), messages);
});

Deno.test("normalizeMessages() keeps extra fields on messages", () => {
  const [m] = normalizeMessages([{ role: "user", content: "hi", name: "alice" }]);
  assert.equal(m.name, "alice");
});

Deno.test("normalizeMessages() returns new message objects", () => {
  const input = [{ role: "user", content: "hi" }];
  const [m] = normalizeMessages(input);
  assert.notEqual(m, input[0]);
});

Deno.test("normalizeMessages() flattens OpenAI-style tool calls to {id, name, arguments}", () => {
  const [m] = normalizeMessages([{
    role: "assistant",
    content: null,
    tool_calls: [{
      id: "call_1",
      type: "function",
      function: { name: "calc", arguments: '{"expr":"2+2"}' },
    }],
  }]);
  assert.deepEqual(m, {
    role: "assistant",
    content: null,
    tool_calls: [{ id: "call_1", name: "calc", arguments: '{"expr":"2+2"}' }],
  });
});

Deno.test("normalizeMessages() JSON-encodes non-string tool-call arguments", () => {
  const [m] = normalizeMessages([{
    role: "assistant",
    content: "",
    tool_calls: [
      { id: "a", type: "function", function: { name: "calc", arguments: { expr: "2+2", n: 1 } } },
      { id: "b", type: "function", function: { name: "noop" } },
    ],
  }]);
  assert.deepEqual(m.tool_calls, [
    { id: "a", name: "calc", arguments: '{"expr":"2+2","n":1}' },
    { id: "b", name: "noop", arguments: "{}" },
  ]);
});

Deno.test("normalizeMessages() uses the function name as id when a tool call has none", () => {
  const [m] = normalizeMessages([{
    role: "assistant",
    content: "",
    tool_calls: [{ type: "function", function: { name: "search", arguments: "{}" } }],
  }]);
  assert.deepEqual(m.tool_calls, [{ id: "search", name: "search", arguments: "{}" }]);
});

Deno.test("normalizeMessages() keeps tool calls that are already flat", () => {
  const calls = [{ id: "c", name: "calc", arguments: '{"x":1}' }];
  const [m] = normalizeMessages([{ role: "assistant", content: "", tool_calls: calls }]);
  assert.deepEqual(m.tool_calls, calls);
});

Deno.test("normalizeMessages() drops an empty or null tool_calls list from assistant messages", () => {
  const [a, b] = normalizeMessages([
    { role: "assistant", content: "x", tool_calls: [] },
    { role: "assistant", content: "y", tool_calls: null },
  ]);
  assert.equal("tool_calls" in a, false);
  assert.equal("tool_calls" in b, false);
});

Deno.test("normalizeMessages() gives an assistant message without content a null content", () => {
  const [m] = normalizeMessages([{ role: "assistant", reasoning_content: "hmm" }]);
  assert.deepEqual(m, { role: "assistant", reasoning_content: "hmm", content: null });
});

Deno.test("normalizeMessages() fills a missing content with '' and stringifies scalar content", () => {
  const [user, tool, system] = normalizeMessages([
    { role: "user" },
    { role: "tool", tool_call_id: 7, content: 42 },
    { role: "system", content: null },
  ]);
  assert.deepEqual(user, { role: "user", content: "" });
  assert.deepEqual(tool, { role: "tool", tool_call_id: "7", content: "42" });
  assert.deepEqual(system, { role: "system", content: "" });
});

Deno.test("normalizeMessages() gives a tool message without tool_call_id an empty one", () => {
  const [m] = normalizeMessages([{ role: "tool", content: "ok" }]);
  assert.equal(m.tool_call_id, "");
});

Deno.test("normalizeMessages() throws a TypeError for an unknown role, naming the index", () => {
  assert.throws(
    () => normalizeMessages([{ role: "user", content: "a" }, { role: "developer", content: "b" }]),
    (e: unknown) =>
      e instanceof TypeError && e.message === 'Message 1 has unknown role "developer"',
  );
  assert.throws(() => normalizeMessages([{ content: "no role" }]), TypeError);
});

Deno.test("normalizeMessages() throws a TypeError for a non-object message or a non-list value", () => {
  assert.throws(() => normalizeMessages(["hi"]), /Message 0 must be an object/);
  assert.throws(() => normalizeMessages([null]), TypeError);
  assert.throws(() => normalizeMessages(42), /Messages must be a string or a list, got number/);
  assert.throws(() => normalizeMessages({ role: "user", content: "x" }), TypeError);
});

Deno.test("normalizeMessages() of an empty list is an empty list", () => {
  assert.deepEqual(normalizeMessages([]), []);
});

Deno.test("normalizeToolCall() rejects a tool call that is not an object", () => {
  assert.throws(() => normalizeToolCall("calc"), TypeError);
  assert.throws(() => normalizeToolCall(null), TypeError);
});

// ---- normalizeToolDefs ------------------------------------------------------------------

Deno.test("normalizeToolDefs() keeps a valid tool definition and its extra keys", () => {
  const tool = {
    name: "calc",
    description: "Evaluate an expression",
    parameters: { type: "object", properties: { expr: { type: "string" } }, required: ["expr"] },
    strict: true,
    extra: 1,
  };
  assert.deepEqual(normalizeToolDefs([tool]), [tool]);
});

Deno.test("normalizeToolDefs() defaults description to '' and parameters to an empty object schema", () => {
  assert.deepEqual(normalizeToolDefs([{ name: "ping" }]), [
    { name: "ping", description: "", parameters: { type: "object", properties: {} } },
  ]);
});

Deno.test("normalizeToolDefs() maps null and undefined to an empty list", () => {
  assert.deepEqual(normalizeToolDefs(null), []);
  assert.deepEqual(normalizeToolDefs(undefined), []);
});

Deno.test("normalizeToolDefs() rejects the OpenAI {type: 'function'} shape with a RangeError", () => {
  const openai = {
    type: "function",
    function: { name: "calc", description: "", parameters: { type: "object", properties: {} } },
  };
  assert.throws(
    () => normalizeToolDefs([{ name: "ok" }, openai], "info.tool_defs"),
    (e: unknown) =>
      e instanceof RangeError &&
      e.message.startsWith(
        'info.tool_defs[1] uses the OpenAI {type: "function", function: {...}} shape',
      ) &&
      e.message.includes("give {name, description, parameters} instead"),
  );
});

Deno.test("normalizeToolDefs() rejects a tool without a non-empty name, naming its index", () => {
  assert.throws(
    () => normalizeToolDefs([{ description: "nameless" }]),
    (e: unknown) =>
      e instanceof TypeError && e.message === "tool_defs[0].name must be a non-empty string",
  );
  assert.throws(() => normalizeToolDefs([{ name: "" }]), TypeError);
  assert.throws(() => normalizeToolDefs([{ name: 3 }]), TypeError);
});

Deno.test("normalizeToolDefs() rejects a value that is not a list of objects", () => {
  assert.throws(() => normalizeToolDefs({ name: "calc" }), /tool_defs must be a list/);
  assert.throws(() => normalizeToolDefs(["calc"], "defs"), /defs\[0\] must be an object/);
});

// ---- contentText ------------------------------------------------------------------------

Deno.test("contentText() returns string content as it is", () => {
  assert.equal(contentText("  hello  "), "  hello  ");
});

Deno.test("contentText() joins the text parts with spaces and skips other parts", () => {
  const parts: ContentPart[] = [
    { type: "text", text: "look at" },
    { type: "image_url", image_url: { url: "data:image/png;base64,AAA" } },
    { type: "text", text: "this" },
    { type: "input_audio", input_audio: { data: "x", format: "wav" } },
  ];
  assert.equal(contentText(parts), "look at this");
});

Deno.test("contentText() trims the joined parts and ignores text parts without a string", () => {
  assert.equal(contentText([{ type: "text", text: 5 } as never, { type: "text", text: "x" }]), "x");
  assert.equal(contentText([{ type: "text", text: "" }, { type: "text", text: "y" }]), "y");
});

Deno.test("contentText() returns '' for null, undefined and empty parts", () => {
  assert.equal(contentText(null), "");
  assert.equal(contentText(undefined), "");
  assert.equal(contentText([]), "");
});

Deno.test("clone() returns a deep copy", () => {
  const value = { a: [{ b: 1 }] };
  const copy = clone(value);
  copy.a[0].b = 2;
  assert.equal(value.a[0].b, 1);
});
