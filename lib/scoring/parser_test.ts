import assert from "node:assert/strict";
import { extractBoxedAnswer } from "./extract.ts";
import { MaybeThinkParser, messageText, Parser, ThinkParser, XMLParser } from "./parser.ts";
import type { Messages } from "../types.ts";

/** Runs `fn` with console.warn captured, so tests can assert on warnings and stay quiet. */
function captureWarnings<T>(fn: () => T): { value: T; warnings: string[] } {
  const original = console.warn;
  const warnings: string[] = [];
  console.warn = (...args: unknown[]) => {
    warnings.push(args.map(String).join(" "));
  };
  try {
    return { value: fn(), warnings };
  } finally {
    console.warn = original;
  }
}

function thinkParser(options?: ConstructorParameters<typeof ThinkParser>[0]): ThinkParser {
  return captureWarnings(() => new ThinkParser(options)).value;
}

function xmlParser(...args: ConstructorParameters<typeof XMLParser>): XMLParser {
  return captureWarnings(() => new XMLParser(...args)).value;
}

function assistant(content: string): Messages[number] {
  return { role: "assistant", content };
}

function assertClose(actual: number, expected: number): void {
  assert.ok(Math.abs(actual - expected) < 1e-9, `expected ${expected}, got ${actual}`);
}

const strictBoxed = (text: string) => extractBoxedAnswer(text, { strict: true });

// messageText

Deno.test("messageText() returns string content unchanged", () => {
  assert.equal(messageText("  as is \n"), "  as is \n");
});

Deno.test("messageText() joins text parts with a space and trims the result", () => {
  assert.equal(
    messageText([
      { type: "text", text: " first" },
      { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
      { type: "text", text: "second " },
    ]),
    "first second",
  );
});

Deno.test("messageText() returns an empty string for null, undefined and part lists without text", () => {
  assert.equal(messageText(null), "");
  assert.equal(messageText(undefined), "");
  assert.equal(messageText([]), "");
  assert.equal(
    messageText([{ type: "input_audio", input_audio: { data: "", format: "wav" } }]),
    "",
  );
});

// Parser

Deno.test("Parser.parse() returns the text as is by default", () => {
  assert.equal(new Parser().parse("This is a test string"), "This is a test string");
});

Deno.test("Parser.parse() applies extractFn", () => {
  const parser = new Parser({ extractFn: extractBoxedAnswer });
  assert.equal(parser.parse("so \\boxed{12}"), "12");
  assert.equal(parser.extractFn, extractBoxedAnswer);
});

Deno.test("Parser.parseAnswer() parses a string completion directly", () => {
  const parser = new Parser({ extractFn: (t) => t.toUpperCase() });
  assert.equal(parser.parseAnswer("an answer"), "AN ANSWER");
});

Deno.test("Parser.parseAnswer() parses the last assistant message of a list", () => {
  const completion: Messages = [
    { role: "user", content: "What is 2+2?" },
    { role: "assistant", content: "maybe 5" },
    { role: "user", content: "Sure?" },
    { role: "assistant", content: "The answer is 4" },
    { role: "tool", tool_call_id: "t1", content: "ignored" },
  ];
  assert.equal(new Parser().parseAnswer(completion), "The answer is 4");
});

Deno.test("Parser.parseAnswer() returns null for an empty list", () => {
  assert.equal(new Parser().parseAnswer([]), null);
});

Deno.test("Parser.parseAnswer() returns null when there is no assistant message", () => {
  assert.equal(new Parser().parseAnswer([{ role: "user", content: "Hello" }]), null);
});

Deno.test("Parser.parseAnswer() joins the text parts of list content with a space", () => {
  const completion: Messages = [{
    role: "assistant",
    content: [
      { type: "text", text: "\\boxed{1}" },
      { type: "image_url", image_url: { url: "https://example.com/x.png" } },
      { type: "text", text: "\\boxed{2}" },
    ],
  }];
  assert.equal(new Parser().parseAnswer(completion), "\\boxed{1} \\boxed{2}");
  assert.equal(new Parser({ extractFn: extractBoxedAnswer }).parseAnswer(completion), "2");
});

Deno.test("Parser.parseAnswer() parses an empty string when the assistant content is null", () => {
  const seen: string[] = [];
  const parser = new Parser({
    extractFn: (t) => {
      seen.push(t);
      return t;
    },
  });
  const completion: Messages = [{
    role: "assistant",
    content: null,
    tool_calls: [{ id: "c1", name: "f", arguments: "{}" }],
  }];
  assert.equal(parser.parseAnswer(completion), "");
  assert.deepEqual(seen, [""]);
});

Deno.test("Parser.parseAnswer() uses a subclass's parse()", () => {
  class Shouting extends Parser {
    override parse(text: string): string {
      return `${text}!`;
    }
  }
  assert.equal(new Shouting().parseAnswer([assistant("hi")]), "hi!");
  assert.equal(new Shouting().parseAnswer("yo"), "yo!");
});

Deno.test("Parser role filters keep only messages of their role, in order", () => {
  const messages: Messages = [
    { role: "system", content: "be brief" },
    { role: "user", content: "Hello" },
    { role: "assistant", content: "Hi there" },
    { role: "tool", tool_call_id: "t1", content: "42" },
    { role: "user", content: "How are you?" },
    { role: "assistant", content: "I'm doing well" },
    { role: "text", content: "raw" },
  ];
  const parser = new Parser();
  assert.deepEqual(parser.getAssistantMessages(messages).map((m) => m.content), [
    "Hi there",
    "I'm doing well",
  ]);
  assert.deepEqual(parser.getUserMessages(messages).map((m) => m.content), [
    "Hello",
    "How are you?",
  ]);
  assert.deepEqual(parser.getSystemMessages(messages).map((m) => m.content), ["be brief"]);
  assert.deepEqual(parser.getToolMessages(messages).map((m) => m.tool_call_id), ["t1"]);
  assert.deepEqual(parser.getAssistantMessages([]), []);
});

Deno.test("Parser.getFormatRewardFunc() always returns 1", () => {
  const reward = new Parser().getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("test")] }), 1.0);
  assert.equal(reward({ completion: [] }), 1.0);
  assert.equal(reward({ completion: "plain" }), 1.0);
});

Deno.test("format reward functions are named format_reward and take one context object", () => {
  const parsers: Parser<unknown>[] = [
    new Parser(),
    thinkParser(),
    new MaybeThinkParser(),
    xmlParser(["answer"]),
  ];
  for (const parser of parsers) {
    const reward = parser.getFormatRewardFunc();
    assert.equal(reward.name, "format_reward");
    const context = { completion: [assistant("x")], answer: "x", prompt: [] };
    assert.equal(typeof reward(context), "number");
  }
});

// ThinkParser

Deno.test("ThinkParser warns once per construction", () => {
  const first = captureWarnings(() => new ThinkParser());
  assert.equal(first.warnings.length, 1);
  assert.match(first.warnings[0], /<think>/);
  assert.match(first.warnings[0], /MaybeThinkParser/);
  const second = captureWarnings(() => new ThinkParser());
  assert.equal(second.warnings.length, 1);
});

Deno.test("ThinkParser.parse() returns the trimmed text after </think>", () => {
  const text =
    "<think>\n  Let me think.\n  Several factors.\n  </think>\n  The final answer is 42.";
  assert.equal(thinkParser().parse(text), "The final answer is 42.");
});

Deno.test("ThinkParser.parse() returns an empty string when </think> is missing", () => {
  assert.equal(thinkParser().parse("Just a simple answer without thinking tags."), "");
  assert.equal(thinkParser().parse("<think>never closed, answer 42"), "");
});

Deno.test("ThinkParser.parse() passes an empty string to extractFn when </think> is missing", () => {
  const seen: string[] = [];
  const parser = thinkParser({
    extractFn: (t) => {
      seen.push(t);
      return `[${t}]`;
    },
  });
  assert.equal(parser.parse("\\boxed{42}"), "[]");
  assert.deepEqual(seen, [""]);
});

Deno.test("ThinkParser.parse() keeps only the text after the last </think>", () => {
  const text =
    "<think>First thought</think>\n  Some text.\n  <think>Second</think>\n  Final answer here.";
  assert.equal(thinkParser().parse(text), "Final answer here.");
});

Deno.test("ThinkParser.parse() returns an empty string when nothing follows </think>", () => {
  assert.equal(thinkParser().parse("<think>Some thinking</think>"), "");
  assert.equal(thinkParser().parse("<think>Some thinking</think>  \n "), "");
});

Deno.test("ThinkParser.parse() applies extractFn to the text after </think>", () => {
  const parser = thinkParser({ extractFn: extractBoxedAnswer });
  assert.equal(parser.parse("<think>\\boxed{1}</think>\n The answer is \\boxed{42}."), "42");
  assert.equal(parser.parse("<think>hmm</think>\n Just a plain answer.\n"), "Just a plain answer.");
});

Deno.test("ThinkParser.parseAnswer() parses the last assistant message and string completions", () => {
  const parser = thinkParser();
  assert.equal(
    parser.parseAnswer([
      { role: "user", content: "What is 2+2?" },
      assistant("<think>Let me calculate</think>The answer is 4"),
    ]),
    "The answer is 4",
  );
  assert.equal(parser.parseAnswer("<think>Calculating...</think>Result: 42"), "Result: 42");
  assert.equal(parser.parseAnswer([{ role: "user", content: "Q" }]), null);
});

Deno.test("ThinkParser format reward is 1 for one well-formed message", () => {
  const reward = thinkParser().getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("<think>Let me think</think>Final answer")] }), 1.0);
  assert.equal(reward({ completion: [assistant("\n  <think>a</think>b")] }), 1.0);
});

Deno.test("ThinkParser format reward counts whitespace after </think> as content", () => {
  const reward = thinkParser().getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("<think>only thinking</think> ")] }), 1.0);
});

Deno.test("ThinkParser format reward is 0 for badly formed messages", () => {
  const reward = thinkParser().getFormatRewardFunc();
  const bad = [
    "Just an answer without thinking",
    "<think>First</think><think>Second</think>Answer",
    "<think>Only thinking</think>",
    "Preamble <think>late</think>answer",
    "<think>no close, answer",
    "<think>a</think>b</think>c",
  ];
  for (const content of bad) {
    assert.equal(reward({ completion: [assistant(content)] }), 0.0, content);
  }
});

Deno.test("ThinkParser format reward averages mixed messages to 2/3", () => {
  const reward = thinkParser().getFormatRewardFunc();
  const completion: Messages = [
    assistant("<think>Good thinking</think>Good answer"),
    { role: "user", content: "not scored" },
    assistant("Bad answer without thinking"),
    { role: "tool", tool_call_id: "t", content: "<think>x</think>y" },
    assistant("<think>More thinking</think>Another good answer"),
  ];
  assert.equal(reward({ completion }), 2.0 / 3.0);
});

Deno.test("ThinkParser format reward is 0 without assistant messages", () => {
  const reward = thinkParser().getFormatRewardFunc();
  assert.equal(reward({ completion: [{ role: "user", content: "Question" }] }), 0.0);
  assert.equal(reward({ completion: [] }), 0.0);
});

Deno.test("ThinkParser format reward reads text parts and scores null content as 0", () => {
  const reward = thinkParser().getFormatRewardFunc();
  const parts: Messages = [{
    role: "assistant",
    content: [{ type: "text", text: "<think>a</think>" }, { type: "text", text: "b" }],
  }];
  assert.equal(reward({ completion: parts }), 1.0);
  assert.equal(reward({ completion: [{ role: "assistant", content: null }] }), 0.0);
});

Deno.test("ThinkParser format reward scores a string completion as one message", () => {
  const reward = thinkParser().getFormatRewardFunc();
  assert.equal(reward({ completion: "<think>a</think>b" }), 1.0);
  assert.equal(reward({ completion: "b" }), 0.0);
});

// MaybeThinkParser

Deno.test("MaybeThinkParser does not warn when constructed", () => {
  assert.deepEqual(captureWarnings(() => new MaybeThinkParser()).warnings, []);
});

Deno.test("MaybeThinkParser.parse() returns text without think tags unchanged", () => {
  const text = "This is a test string without thinking tags";
  assert.equal(new MaybeThinkParser().parse(text), text);
  assert.equal(new MaybeThinkParser().parse("  padded \n"), "padded");
});

Deno.test("MaybeThinkParser.parse() returns the trimmed text after the last </think>", () => {
  const parser = new MaybeThinkParser();
  assert.equal(
    parser.parse("<think>tags</think> This is the final answer"),
    "This is the final answer",
  );
  assert.equal(parser.parse("<think>a</think>x<think>b</think> y "), "y");
  assert.equal(parser.parse("<think>unclosed and answer"), "<think>unclosed and answer");
});

Deno.test("MaybeThinkParser.parseAnswer() handles messages with and without reasoning", () => {
  const parser = new MaybeThinkParser();
  assert.equal(
    parser.parseAnswer([{ role: "user", content: "2+2?" }, assistant("The answer is 4")]),
    "The answer is 4",
  );
  assert.equal(
    parser.parseAnswer([
      { role: "user", content: "2+2?" },
      assistant("<think>hm</think>The answer is 4"),
    ]),
    "The answer is 4",
  );
});

Deno.test("MaybeThinkParser with strict boxed extraction yields only boxed answers", () => {
  const parser = new MaybeThinkParser({ extractFn: strictBoxed });
  assert.equal(parser.parse("<think>maybe \\boxed{3}</think> so \\boxed{4}"), "4");
  assert.equal(parser.parse("<think>\\boxed{3}</think> no box"), "");
  assert.equal(parser.parseAnswer([assistant("plain \\boxed{x^2}")]), "x^2");
});

Deno.test("MaybeThinkParser format reward is always 1", () => {
  const reward = new MaybeThinkParser().getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("no tags at all")] }), 1.0);
  assert.equal(reward({ completion: [] }), 1.0);
});

// XMLParser: construction

Deno.test("XMLParser.getFields() returns the canonical names in order", () => {
  assert.deepEqual(xmlParser(["reasoning", "answer"]).getFields(), ["reasoning", "answer"]);
  assert.deepEqual(xmlParser(["reasoning", ["code", "answer"]]).getFields(), ["reasoning", "code"]);
});

Deno.test("XMLParser answerField defaults to answer and can be set", () => {
  assert.equal(xmlParser(["answer"]).answerField, "answer");
  assert.equal(xmlParser(["result"], { answerField: "result" }).answerField, "result");
});

Deno.test("XMLParser accepts an empty field list", () => {
  const parser = xmlParser([]);
  assert.deepEqual(parser.getFields(), []);
  assert.deepEqual(parser.parse("<answer>1</answer>"), {});
  assert.equal(parser.getFormatStr(), "");
  assert.equal(parser.format({}), "");
  assert.equal(parser.parseAnswer("<answer>1</answer>"), null);
});

Deno.test("XMLParser throws a TypeError for a field that is not a string or a list", () => {
  const bad = ["valid", 123] as unknown as string[];
  assert.throws(() => new XMLParser(bad), {
    name: "TypeError",
    message: "XMLParser field 1 must be a string or a list of strings, got number 123",
  });
  assert.throws(() => new XMLParser([null] as unknown as string[]), TypeError);
  assert.throws(() => new XMLParser("answer" as unknown as string[]), {
    name: "TypeError",
    message: 'XMLParser fields must be an array, got "answer"',
  });
});

Deno.test("XMLParser throws a TypeError for a non-string alternative", () => {
  const bad = [["code", 7]] as unknown as string[][];
  assert.throws(() => new XMLParser(bad), {
    name: "TypeError",
    message: /XMLParser field 0 has a non-string alternative number 7/,
  });
});

Deno.test("XMLParser throws a RangeError for an empty list of alternatives", () => {
  assert.throws(() => new XMLParser(["a", []]), {
    name: "RangeError",
    message: "XMLParser field 1 is an empty list of alternatives",
  });
});

Deno.test("XMLParser throws a RangeError for duplicate canonical names", () => {
  assert.throws(() => new XMLParser(["field1", "field1"]), {
    name: "RangeError",
    message: 'Duplicate XMLParser field "field1"',
  });
  assert.throws(() => new XMLParser(["code", ["code", "answer"]]), RangeError);
});

Deno.test("XMLParser allows a tag to reappear as a non-canonical alternative", () => {
  const parser = xmlParser(["answer", ["code", "answer"]]);
  assert.deepEqual(parser.getFields(), ["answer", "code"]);
  assert.deepEqual(parser.parse("<answer>1</answer>"), { answer: "1", code: null });
});

Deno.test("XMLParser throws a RangeError for an empty tag name", () => {
  assert.throws(() => new XMLParser([""]), { name: "RangeError", message: /empty tag name/ });
  assert.throws(() => new XMLParser([["a", ""]]), RangeError);
});

Deno.test("XMLParser warns when a think field is included", () => {
  const withThink = captureWarnings(() => new XMLParser(["think", "answer"]));
  assert.ok(withThink.warnings.length <= 1);
  for (const warning of withThink.warnings) assert.match(warning, /"think"/);
  assert.deepEqual(captureWarnings(() => new XMLParser(["reasoning", "answer"])).warnings, []);
});

Deno.test("XMLParser warns about a think field once per process, however many parsers", async () => {
  // A fresh process, so no other test has used up the one warning.
  const script = `
    import { XMLParser } from ${JSON.stringify(new URL("./parser.ts", import.meta.url).href)};
    for (let i = 0; i < 3; i++) new XMLParser(["think", "answer"]);
    new XMLParser([["think", "thought"], "answer"]);
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--quiet", "--no-check", script],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  assert.equal(stderr.match(/XMLParser has a "think" field/g)?.length, 1, stderr);
});

Deno.test("XMLParser is usable wherever any parser is accepted", () => {
  const slots: Parser<unknown>[] = [xmlParser(["answer"]), new Parser()];
  assert.ok(slots.every((p) => p instanceof Parser));
});

// XMLParser.parse

Deno.test("XMLParser.parse() returns the trimmed content of each field", () => {
  const text = `
    <reasoning>
    Let me think about this problem step by step.
    </reasoning>
    <answer>
    The final answer is 42.
    </answer>
  `;
  assert.deepEqual(xmlParser(["reasoning", "answer"]).parse(text), {
    reasoning: "Let me think about this problem step by step.",
    answer: "The final answer is 42.",
  });
});

Deno.test("XMLParser.parse() exposes every alternative tag, null when absent", () => {
  const text =
    "<reasoning>First, understand it.</reasoning>\n<code>\n def solve(): return 42\n</code>";
  assert.deepEqual(xmlParser(["reasoning", ["code", "answer"]]).parse(text), {
    reasoning: "First, understand it.",
    code: "def solve(): return 42",
    answer: null,
  });
});

Deno.test("XMLParser.parse() gives null for a missing field", () => {
  const parsed = xmlParser(["reasoning", "answer"]).parse("<reasoning>Only reasoning</reasoning>");
  assert.equal(parsed.reasoning, "Only reasoning");
  assert.equal(parsed.answer, null);
});

Deno.test("XMLParser.parse() gives an empty string for an empty or blank field", () => {
  const parser = xmlParser(["reasoning", "answer"]);
  assert.deepEqual(parser.parse("<reasoning></reasoning><answer> \n </answer>"), {
    reasoning: "",
    answer: "",
  });
});

Deno.test("XMLParser.parse() trims content even when strip is false", () => {
  const parser = xmlParser(["answer"]);
  const text = "<answer>  spaced content  </answer>";
  assert.equal(parser.parse(text, { strip: true }).answer, "spaced content");
  assert.equal(parser.parse(text, { strip: false }).answer, "spaced content");
});

Deno.test("XMLParser.parse() takes the first occurrence unless last is set", () => {
  const parser = xmlParser(["answer"]);
  const text = "<answer>44</answer> then <answer>\n45\n</answer>";
  assert.equal(parser.parse(text).answer, "44");
  assert.equal(parser.parse(text, { last: true }).answer, "45");
  assert.equal(parser.parse("<answer>only</answer>", { last: true }).answer, "only");
  assert.equal(parser.parse("nothing", { last: true }).answer, null);
});

Deno.test("XMLParser.parse() matches the shortest span and across newlines", () => {
  const parser = xmlParser(["answer"]);
  assert.equal(parser.parse("<answer>a\nb</answer> x </answer>").answer, "a\nb");
});

Deno.test("XMLParser.parse() needs both the opening and the closing tag", () => {
  const parser = xmlParser(["answer"]);
  assert.equal(parser.parse("<answer>unclosed").answer, null);
  assert.equal(parser.parse("unopened</answer>").answer, null);
  assert.equal(parser.parse("<Answer>case</Answer>").answer, null);
});

Deno.test("XMLParser.parse() treats tag names literally, not as patterns", () => {
  const parser = xmlParser(["a.b", "c+"]);
  assert.deepEqual(parser.parse("<aXb>no</aXb><cc>no</cc>"), { "a.b": null, "c+": null });
  assert.deepEqual(parser.parse("<a.b>yes</a.b><c+>too</c+>"), { "a.b": "yes", "c+": "too" });
});

Deno.test("XMLParser.parse() returns own keys even for names like __proto__", () => {
  const parsed = xmlParser(["__proto__", "constructor"]).parse("<__proto__>p</__proto__>");
  assert.ok(Object.hasOwn(parsed, "__proto__"));
  assert.equal(parsed["__proto__"], "p");
  assert.equal(parsed.constructor, null);
});

Deno.test("XMLParser.parse() gives the same result on repeated calls", () => {
  const parser = xmlParser(["answer"]);
  const text = "<answer>1</answer><answer>2</answer>";
  assert.equal(parser.parse(text, { last: true }).answer, "2");
  assert.equal(parser.parse(text).answer, "1");
  assert.equal(parser.parse(text).answer, "1");
});

// XMLParser.parseAnswer

Deno.test("XMLParser.parseAnswer() returns the last answer across messages", () => {
  const completion: Messages = [
    { role: "user", content: "Solve this problem" },
    assistant("<reasoning>Let me think</reasoning><answer>42</answer>"),
    assistant("<reasoning>Actually, let me reconsider</reasoning><answer>43</answer>"),
  ];
  assert.equal(xmlParser(["reasoning", "answer"]).parseAnswer(completion), "43");
});

Deno.test("XMLParser.parseAnswer() returns the last answer of a string completion", () => {
  const text = "<answer>44</answer><reasoning>not right either.</reasoning><answer>45</answer>";
  assert.equal(xmlParser(["reasoning", "answer"]).parseAnswer(text), "45");
});

Deno.test("XMLParser.parseAnswer() takes the first answer within one message", () => {
  const completion = [assistant("<answer>44</answer><answer>45</answer>")];
  assert.equal(xmlParser(["reasoning", "answer"]).parseAnswer(completion), "44");
});

Deno.test("XMLParser.parseAnswer() falls back to earlier messages when later ones lack an answer", () => {
  const completion: Messages = [
    assistant("<answer>7</answer>"),
    { role: "user", content: "<answer>from the user</answer>" },
    assistant("<reasoning>just musing</reasoning>"),
  ];
  assert.equal(xmlParser(["reasoning", "answer"]).parseAnswer(completion), "7");
});

Deno.test("XMLParser.parseAnswer() returns null when no answer is found", () => {
  const parser = xmlParser(["reasoning", "answer"]);
  assert.equal(parser.parseAnswer([assistant("<reasoning>Only reasoning</reasoning>")]), null);
  assert.equal(parser.parseAnswer([]), null);
  assert.equal(parser.parseAnswer([{ role: "user", content: "<answer>1</answer>" }]), null);
  assert.equal(parser.parseAnswer("no tags"), null);
});

Deno.test("XMLParser.parseAnswer() returns an empty answer rather than skipping it", () => {
  const completion = [assistant("<answer>1</answer>"), assistant("<answer></answer>")];
  assert.equal(xmlParser(["answer"]).parseAnswer(completion), "");
});

Deno.test("XMLParser.parseAnswer() reads the configured answerField, which may be an alternative", () => {
  const canonical = xmlParser(["reasoning", ["code", "answer"]], { answerField: "code" });
  assert.equal(canonical.parseAnswer([assistant("<code>x = 1</code><answer>2</answer>")]), "x = 1");
  const alternative = xmlParser(["reasoning", ["code", "answer"]]);
  assert.equal(alternative.parseAnswer([assistant("<code>x = 1</code><answer>2</answer>")]), "2");
  const unknown = xmlParser(["reasoning"], { answerField: "missing" });
  assert.equal(unknown.parseAnswer("<missing>1</missing>"), null);
});

Deno.test("XMLParser.parseAnswer() reads text parts of list content", () => {
  const completion: Messages = [{
    role: "assistant",
    content: [{ type: "text", text: "<answer>" }, { type: "text", text: "9</answer>" }],
  }];
  assert.equal(xmlParser(["answer"]).parseAnswer(completion), "9");
});

// XMLParser formatting

Deno.test("XMLParser.getFormatStr() lists each field's tags around ...", () => {
  assert.equal(
    xmlParser(["reasoning", "answer"]).getFormatStr(),
    "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>",
  );
});

Deno.test("XMLParser.getFormatStr() renders alternatives in brackets", () => {
  assert.equal(
    xmlParser(["reasoning", ["code", "answer"]]).getFormatStr(),
    "<reasoning>\n...\n</reasoning>\n<[ code | answer ]>\n...\n</[ code | answer ]>",
  );
  assert.equal(xmlParser([["solo"]]).getFormatStr(), "<solo>\n...\n</solo>");
});

Deno.test("XMLParser.format() writes canonical blocks joined by newlines", () => {
  assert.equal(
    xmlParser(["reasoning", "answer"]).format({ reasoning: "My reasoning", answer: "42" }),
    "<reasoning>\nMy reasoning\n</reasoning>\n<answer>\n42\n</answer>",
  );
});

Deno.test("XMLParser.format() accepts a value under an alternative name and writes the canonical tag", () => {
  const parser = xmlParser(["reasoning", ["code", "answer"]]);
  const expected = "<reasoning>\ntest\n</reasoning>\n<code>\nprint('hello')\n</code>";
  assert.equal(parser.format({ reasoning: "test", code: "print('hello')" }), expected);
  assert.equal(parser.format({ reasoning: "test", answer: "print('hello')" }), expected);
});

Deno.test("XMLParser.format() prefers the canonical name when several are given", () => {
  const parser = xmlParser([["code", "answer"]]);
  assert.equal(parser.format({ answer: "alt", code: "canon" }), "<code>\ncanon\n</code>");
});

Deno.test("XMLParser.format() keeps empty values and ignores unknown keys", () => {
  const parser = xmlParser(["answer"]);
  assert.equal(parser.format({ answer: "", extra: "x" }), "<answer>\n\n</answer>");
});

Deno.test("XMLParser.format() throws a RangeError naming a missing field", () => {
  const parser = xmlParser(["reasoning", ["code", "answer"]]);
  assert.throws(() => parser.format({ reasoning: "Only reasoning" }), {
    name: "RangeError",
    message: 'Missing value for field "code" (allowed names: "code", "answer")',
  });
});

Deno.test("XMLParser.format() output parses back to the same values", () => {
  const parser = xmlParser(["reasoning", "answer"]);
  const text = parser.format({ reasoning: "because", answer: "42" });
  assert.deepEqual(parser.parse(text), { reasoning: "because", answer: "42" });
});

// XMLParser format reward

Deno.test("XMLParser format reward gives a plain-text message 0.2", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("Just plain text without XML")] }), 0.2);
});

Deno.test("XMLParser format reward gives a well-formed message 1", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  const content = "<reasoning>Good reasoning</reasoning>\n<answer>42</answer>";
  assertClose(reward({ completion: [assistant(`  ${content}\n`)] }), 1.0);
});

Deno.test("XMLParser format reward scales field credit by the share of fields present", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  // answer parsed (0.4 * 1/2), spacing 0.2, does not start with <reasoning>, ends with </answer>.
  assertClose(reward({ completion: [assistant("<answer>42</answer>")] }), 0.6);
  // reasoning parsed (0.4 * 1/2), spacing 0.2, starts with <reasoning>, no closing </answer>.
  assertClose(reward({ completion: [assistant("<reasoning>r</reasoning> 42")] }), 0.6);
});

Deno.test("XMLParser format reward counts a field whose tag appears without parsing", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  const content = "<reasoning>never closed <answer>42</answer>";
  assertClose(reward({ completion: [assistant(content)] }), 1.0);
  assertClose(reward({ completion: [assistant("text </reasoning><answer>1</answer>")] }), 0.8);
});

Deno.test("XMLParser format reward gives no field credit when no tag parsed", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  assertClose(reward({ completion: [assistant("<reasoning>unclosed")] }), 0.4);
  assertClose(reward({ completion: [assistant("<reasoning>x <answer>y")] }), 0.4);
});

Deno.test("XMLParser format reward accepts any alternative at the start and the end", () => {
  const reward = xmlParser([["reasoning", "thought"], ["code", "answer"]]).getFormatRewardFunc();
  assertClose(reward({ completion: [assistant("<thought>x</thought><answer>y</answer>")] }), 1.0);
  assertClose(reward({ completion: [assistant("<reasoning>x</reasoning><code>y</code>")] }), 1.0);
});

Deno.test("XMLParser format reward averages over assistant messages only", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  const completion: Messages = [
    assistant("<reasoning>a</reasoning><answer>b</answer>"),
    { role: "user", content: "plain user text" },
    assistant("plain"),
  ];
  assertClose(reward({ completion }), 0.6);
});

Deno.test("XMLParser format reward is 0 without assistant messages", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  assert.equal(reward({ completion: [] }), 0.0);
  assert.equal(reward({ completion: [{ role: "user", content: "<answer>1</answer>" }] }), 0.0);
});

Deno.test("XMLParser format reward scores a string completion as one message", () => {
  const reward = xmlParser(["reasoning", "answer"]).getFormatRewardFunc();
  assert.equal(reward({ completion: "plain" }), 0.2);
  assertClose(reward({ completion: "<reasoning>a</reasoning><answer>b</answer>" }), 1.0);
});

Deno.test("XMLParser format reward with no fields gives every message 0.2", () => {
  const reward = xmlParser([]).getFormatRewardFunc();
  assert.equal(reward({ completion: [assistant("<answer>1</answer>")] }), 0.2);
});

Deno.test("XMLParser format reward scores null content as plain text", () => {
  const reward = xmlParser(["answer"]).getFormatRewardFunc();
  assert.equal(reward({ completion: [{ role: "assistant", content: null }] }), 0.2);
});

Deno.test("parseAnswer() finds the last assistant message without a filtered copy of the list", () => {
  const parser = new Parser();
  const messages: Messages = [
    { role: "user", content: "q" },
    { role: "assistant", content: "first" },
    { role: "user", content: "again" },
    { role: "assistant", content: "4" },
  ];
  assert.equal(parser.parseAnswer(messages), "4");
  assert.equal(parser.parseAnswer([{ role: "user", content: "q" }]), null);
});

Deno.test("parseAnswer() still goes through a subclass's getAssistantMessages()", () => {
  class FirstOnly extends Parser {
    override getAssistantMessages(messages: Messages) {
      return super.getAssistantMessages(messages).slice(0, 1);
    }
  }
  const messages: Messages = [
    { role: "assistant", content: "first" },
    { role: "assistant", content: "last" },
  ];
  assert.equal(new FirstOnly().parseAnswer(messages), "first");
  assert.equal(new Parser().parseAnswer(messages), "last");
});
