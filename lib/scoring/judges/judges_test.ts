import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { OpenAIChatClient } from "../../model/client.ts";
import { type Reply, startModelServer } from "../../model/local_server.ts";
import { ConfigError, JudgeVerdictError } from "../../errors.ts";
import { renderTranscript } from "../../messages.ts";
import type { Messages } from "../../types.ts";
import { buildJudges } from "./config.ts";
import {
  fillTemplate,
  Judge,
  type JudgedTrace,
  type JudgeEndpoint,
  type JudgeRecord,
} from "./judge.ts";
import { findJsonObject, parseJudgeChoice } from "./parse.ts";
import { REFERENCE_TEMPLATE, ReferenceJudge } from "./reference.ts";
import {
  criterionLine,
  fenceFor,
  RUBRIC_JSON_SUFFIX,
  RUBRIC_TEMPLATE,
  RubricJudge,
} from "./rubric.ts";
import { DEFAULT_JUDGE_PROMPT } from "../judge_rubric.ts";
import { criterionMetrics, scoreVerdicts, type VerdictFault, weightedScore } from "./verdicts.ts";

const CONVERSATION: Messages = [
  { role: "user", content: "Capital of France?" },
  {
    role: "assistant",
    content: "Let me look it up.",
    reasoning_content: "SECRET REASONING",
    tool_calls: [{ id: "c1", name: "search", arguments: '{"q": "france"}' }],
  },
  { role: "tool", tool_call_id: "c1", content: "TOOL RESULT: Paris is the capital." },
  { role: "assistant", content: "It is Paris." },
];

function trace(
  messages: Messages = CONVERSATION,
): JudgedTrace & { metrics: Record<string, number> } {
  return { info: {}, messages: structuredClone(messages), metrics: {} };
}

/** A loopback judge endpoint answering from `replies` in order (the last one repeats). */
async function judgeServer(...replies: Reply[]) {
  let i = 0;
  const server = await startModelServer({
    responder: () => replies[Math.min(i++, replies.length - 1)],
  });
  const endpoint = {
    client: new OpenAIChatClient({ base_url: server.url, max_retries: 0 }),
    model: "judge-m",
  };
  return { server, endpoint };
}

Deno.test("parseJudgeChoice(): think blocks, boxed answers, verdict markers and the last whole word, ignoring case", () => {
  const cases: Array<[string, string[], string | null]> = [
    ["<think>A", ["A", "B"], null],
    ["<think>hmm A</think> B", ["A", "B"], "B"],
    ["<think>x</think>", ["A", "B"], null],
    ["stuff</think>A", ["A", "B"], "A"],
    ["<think>a</think>B<think>c</think>A", ["A", "B"], "A"],
    ["I pick A, not B", ["A", "B"], "B"],
    ["\\boxed{B} though A", ["A", "B"], "B"],
    ["\\boxed{maybe} A", ["A", "B"], null],
    ["\\boxed{A", ["A", "B"], "A"],
    ["\\boxed{}B", ["A", "B"], "B"],
    ["\\boxed{Final answer: B and A}", ["A", "B"], "B"],
    ["VERDICT: yes\nANSWER: no", ["yes", "no"], "yes"],
    ["B\nVerdict: A then B", ["A", "B"], "A"],
    ["A\nAnswer: none", ["A", "B"], null],
    ["ANSWER: maybe\nyes", ["yes", "no"], "yes"],
    ["Answer is: no", ["yes", "no"], "no"],
    ["answer - yes", ["yes", "no"], "yes"],
    ["FINAL ANSWER IS B", ["A", "B"], "B"],
    ["foo\n  Verdict  IS  B", ["A", "B"], "B"],
    ["Judgment:B", ["A", "B"], "B"],
    ["My final verdict is yes", ["yes", "no"], "yes"],
    ["The verdict: A. Final: B", ["A", "B"], "B"],
    ["**Answer:** B", ["A", "B"], "B"],
    ["Final Judgement: A but B", ["A", "B"], "B"],
    ["yesno", ["yes", "no"], null],
    ["yes_no", ["yes", "no"], null],
    ["yes-no", ["yes", "no"], "no"],
    ["INCORRECT", ["correct", "incorrect"], "incorrect"],
    ["not quite right", ["quite right", "wrong"], "quite right"],
    ["A.B", ["A", "A.B"], "A"],
    ["A.B", ["A.B", "A"], "A.B"],
    ["Final Answer: a", ["A", "B"], "A"],
    ["YES", ["Yes", "No"], "Yes"],
    ["", ["A"], null],
    // A word that only starts like a marker is not one.
    ["Answering this: yes, but\nFinal verdict: no", ["yes", "no"], "no"],
    ["Verdicts are tricky. yes\nVERDICT: no", ["yes", "no"], "no"],
  ];
  for (const [text, choices, want] of cases) {
    assert.equal(parseJudgeChoice(text, choices), want, JSON.stringify([text, choices]));
  }
});

Deno.test("the default judge prompts are upstream verifiers' own, word for word, so traces compare", () => {
  const fence = "```";
  assert.equal(
    REFERENCE_TEMPLATE,
    "Given a task, a reference answer, and a response, determine if the response is correct " +
      "\u2014 it must match the reference answer (any one of them, when several are listed) in " +
      "substance (exact wording may differ).\n\n" +
      `Task:\n${fence}\n{question}\n${fence}\n\n` +
      `Reference answer:\n${fence}\n{answer}\n${fence}\n\n` +
      `Response:\n${fence}\n{response}\n${fence}\n\n` +
      'Respond either "{positive}" or "{negative}" only.\n',
  );
  assert.equal(
    RUBRIC_TEMPLATE,
    "Given a task, a response, and a list of grading criteria, determine for each criterion " +
      "whether the response satisfies it.\n\n" +
      `Task:\n${fence}\n{question}\n${fence}\n{reference}\n` +
      `Response:\n${fence}\n{response}\n${fence}\n\n` +
      "Criteria:\n{criteria}\n\n" +
      "For each criterion, answer under its exact name with exactly one of the options given " +
      "in parentheses after it.\n",
  );
  assert.equal(
    RUBRIC_JSON_SUFFIX,
    "\n\nRespond with ONLY a JSON object and nothing else, in exactly this shape:\n" +
      '{"verdicts": [{"name": "<criterion name>", "reason": "<one sentence citing specific ' +
      'evidence from the response>", "verdict": "<answer>"}, ...]}\n' +
      "with one entry per criterion, using each criterion's exact name. For each, first write " +
      "the one-sentence reason grounded in the response, then set verdict to exactly one of the " +
      "options listed in parentheses after that criterion.",
  );
  assert.equal(
    criterionLine({ name: "tone", text: "Is polite.", weight: 1, choices: ["no", "yes"] }),
    "- tone: Is polite. (answer one of, worst to best: no, yes)",
  );
  assert.equal(
    DEFAULT_JUDGE_PROMPT,
    "Given a ground truth answer and a response, determine if the response is correct.\n\n" +
      `Question:\n${fence}\n{question}\n${fence}\n\n` +
      `Ground truth answer:\n${fence}\n{answer}\n${fence}\n\n` +
      `Response:\n${fence}\n{response}\n${fence}\n\n` +
      'Respond either "yes" or "no" only.',
  );
});

Deno.test("a judge with no name and an empty id is keyed by its class name in snake_case, without Judge", () => {
  class CorrectnessJudge extends Judge<number> {
    parse(): number {
      return 1;
    }
    score(): Promise<number> {
      return Promise.resolve(1);
    }
  }
  class MyCodeJudge extends CorrectnessJudge {}
  class Judge2 extends CorrectnessJudge {}
  const endpoint = { model: "m" } as unknown as JudgeEndpoint;
  assert.equal(new CorrectnessJudge({ id: "" }, endpoint, "{x}").name, "correctness");
  assert.equal(new MyCodeJudge({ id: "" }, endpoint, "{x}").name, "my_code");
  assert.equal(new Judge2({ id: "" }, endpoint, "{x}").name, "judge2");
  assert.equal(new MyCodeJudge({ id: "code", name: "" }, endpoint, "{x}").name, "code");
  assert.equal(new MyCodeJudge({ id: "", name: "mine" }, endpoint, "{x}").name, "mine");
  // A class named just "Judge" leaves nothing: the key is "judge".
  const Bare = { Judge: class extends CorrectnessJudge {} }.Judge;
  Object.defineProperty(Bare, "name", { value: "Judge" });
  assert.equal(new Bare({ id: "" }, endpoint, "{x}").name, "judge");
});

Deno.test("fillTemplate() fills known fields in one pass and leaves other braces alone", () => {
  assert.equal(
    fillTemplate("Q:{question} A:{answer}", { question: "{answer}", answer: "x" }),
    "Q:{answer} A:x",
  );
  assert.equal(
    fillTemplate('{"k": 1} {foo} {{question}}', { question: "Q" }),
    '{"k": 1} {foo} {Q}',
  );
  assert.equal(
    fillTemplate("{ question } {Question}", { question: "Q" }),
    "{ question } {Question}",
  );
});

Deno.test("findJsonObject() skips an echoed format example and finds a nested verdicts object", () => {
  const reply =
    'Format: {"verdicts": [...]}\nHere: {"result": {"verdicts": [{"name": "a", "verdict": "yes"}]}}';
  assert.deepEqual(findJsonObject(reply, "verdicts"), {
    verdicts: [{ name: "a", verdict: "yes" }],
  });
  assert.equal(findJsonObject('{"x": "}{"} no', "verdicts"), null);
  assert.deepEqual(findJsonObject('{"verdicts": ["}"]}', "verdicts"), { verdicts: ["}"] });
});

Deno.test("renderTranscript(): role blocks, tool calls as lines, tool results under the tool's name, no reasoning", () => {
  assert.equal(
    renderTranscript(CONVERSATION),
    '[user]\nCapital of France?\n\n[assistant]\nLet me look it up.\n[tool_call search({"q": "france"})]\n\n' +
      "[tool search]\nTOOL RESULT: Paris is the capital.\n\n[assistant]\nIt is Paris.",
  );
});

Deno.test("reference judge: the exact prompt, a list answer one per line, the reply recorded with its usage, and the verdict scored", async () => {
  const { server, endpoint } = await judgeServer({
    content: "Verdict: yes",
    usage: { prompt_tokens: 50, completion_tokens: 2 },
  } as Reply);
  try {
    const judge = new ReferenceJudge({ id: "reference" }, endpoint);
    const t = trace();
    const score = await judge.score(
      { prompt: "Capital of France?", answer: ["Paris", "Lutetia"] },
      t,
    );
    assert.equal(score, 1);
    assert.equal(server.requests.length, 1);
    assert.equal(server.requests[0].body.model, "judge-m");
    assert.deepEqual(server.requests[0].body.messages, [{
      role: "user",
      content: REFERENCE_TEMPLATE
        .replace("{question}", "Capital of France?")
        .replace("{answer}", "Paris\nLutetia")
        .replace("{response}", "It is Paris.")
        .replace("{positive}", "yes")
        .replace("{negative}", "no"),
    }]);
    const [record] = t.info.judge as JudgeRecord[];
    assert.deepEqual(
      { ...record },
      {
        judge: "reference",
        model: "judge-m",
        attempt: 0,
        text: "Verdict: yes",
        parsed: 1,
        usage: { input_tokens: 50, output_tokens: 2 },
      },
    );
  } finally {
    await server.close();
  }
});

Deno.test("reference judge: an empty reply scores 0 with no call; full_trace shows the transcript and never the reasoning; custom choices", async () => {
  const { server, endpoint } = await judgeServer({ content: "B" });
  try {
    const judge = new ReferenceJudge(
      { id: "reference", name: "ref", view: "full_trace", choices: ["A", "B"] },
      endpoint,
    );
    assert.equal(
      await judge.score(
        { prompt: "q", answer: "x" },
        trace([{ role: "user", content: "q" }, {
          role: "assistant",
          content: "  ",
        }]),
      ),
      0,
    );
    // full_trace is never empty while there are messages: it is judged
    assert.equal(server.requests.length, 1);
    const lastOnly = new ReferenceJudge({ id: "reference", choices: ["A", "B"] }, endpoint);
    const t = trace([{ role: "user", content: "q" }, { role: "assistant", content: "" }]);
    assert.equal(await lastOnly.score({ prompt: "q", answer: "x" }, t), 0);
    assert.equal(server.requests.length, 1, "an empty last reply is not sent to the judge");
    assert.equal(t.info.judge, undefined);
    await judge.score({ prompt: "q", answer: "Paris" }, trace());
    const sent = String(server.requests[1].body.messages[0].content);
    assert.match(sent, /TOOL RESULT: Paris is the capital\./);
    assert.doesNotMatch(sent, /SECRET REASONING/);
    assert.match(sent, /Respond either "A" or "B" only\.\n$/);
  } finally {
    await server.close();
  }
});

Deno.test("reference judge: a reply without a verdict is asked again; after max_retries it fails, never scoring 0, every reply recorded", async () => {
  const { server, endpoint } = await judgeServer({ content: "hmm" }, {
    content: "Final answer: NO",
  });
  try {
    const judge = new ReferenceJudge({ id: "reference" }, endpoint);
    const t = trace();
    assert.equal(await judge.score({ prompt: "q", answer: "Paris" }, t), 0);
    const records = t.info.judge as JudgeRecord[];
    assert.deepEqual(records.map((r) => [r.attempt, r.parsed, r.error ?? null]), [
      [0, null, 'judge returned no yes/no verdict: "hmm"'],
      [1, 0, null],
    ]);
  } finally {
    await server.close();
  }
  const again = await judgeServer({ content: "gibberish" });
  try {
    const judge = new ReferenceJudge({ id: "reference", max_retries: 1 }, again.endpoint);
    const t = trace();
    await assert.rejects(
      judge.score({ prompt: "q", answer: "Paris" }, t),
      (e: unknown) =>
        e instanceof JudgeVerdictError &&
        /Judge "reference" gave no verdict in 2 attempts/.test(e.message),
    );
    assert.equal((t.info.judge as JudgeRecord[]).length, 2);
  } finally {
    await again.server.close();
  }
});

Deno.test("rubric judge: criteria in batches (max_criteria) run concurrently, a <judge>/<criterion> metric each, the weighted mean as reward", async () => {
  // Each batch waits for the other to arrive (up to 5 s): run one after the other, the peak of
  // requests in flight would stay 1.
  let inFlight = 0;
  let peak = 0;
  let bothArrived!: () => void;
  const arrived = new Promise<void>((r) => (bothArrived = r));
  const server = await startModelServer({
    responder: async ({ body }) => {
      const text = String(body.messages[0].content);
      peak = Math.max(peak, ++inFlight);
      if (inFlight === 2) bothArrived();
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([arrived, new Promise((r) => (timer = setTimeout(r, 5000)))]);
      clearTimeout(timer);
      inFlight--;
      if (text.includes("- paris:")) {
        return {
          content:
            'Sure. {"verdicts": [{"name": "paris", "reason": "says Paris", "verdict": "yes"}]}',
        };
      }
      return {
        content:
          '```json\n{"verdicts": [{"name": "tone", "reason": "flat", "verdict": "partly"}]}\n```',
      };
    },
  });
  try {
    const criteria = [
      { name: "paris", text: "Names Paris.", weight: 3, choices: ["no", "yes"] },
      { name: "tone", text: "Is polite.", weight: 1, choices: ["no", "partly", "yes"] },
    ];
    const judge = new RubricJudge(
      { id: "rubric", name: "q", criteria, max_criteria: 1, answer_field: "answer" },
      { client: new OpenAIChatClient({ base_url: server.url }), model: "judge-m" },
    );
    const t = trace();
    const score = await judge.score({ prompt: "Capital of France?", answer: "Paris ```x```" }, t);
    assert.equal(peak, 2, "the two batches ran at once");
    assert.equal(score, (3 * 1 + 1 * 0.5) / 4);
    assert.deepEqual(t.metrics, { "q/paris": 1, "q/tone": 0.5 });
    assert.equal(server.requests.length, 2);
    const first = String(
      server.requests.find((r) => String(r.body.messages[0].content).includes("- paris:"))!
        .body.messages[0].content,
    );
    assert.ok(first.includes(criterionLine(criteria[0])));
    assert.ok(!first.includes("- tone:"));
    assert.equal(fenceFor("Paris ```x```"), "````");
    assert.ok(first.includes("\n````\nParis ```x```\n````\n"));
    assert.ok(first.endsWith(RUBRIC_JSON_SUFFIX), "the JSON instruction closes the prompt");
    assert.ok(
      first.includes(
        "\nReference solution (a correct implementation of this task, for comparison):\n````\n",
      ),
    );
    assert.equal((t.info.judge as JudgeRecord[]).length, 2);
  } finally {
    await server.close();
  }
});

Deno.test("rubric judge: a verdict outside a criterion's choices is retried; structured_output asks for the verdict schema", async () => {
  const { server, endpoint } = await judgeServer(
    { content: '{"verdicts": [{"name": "solved", "reason": "r", "verdict": "maybe"}]}' },
    { content: '{"verdicts": [{"name": "solved", "reason": "r", "verdict": "yes"}]}' },
  );
  try {
    const judge = new RubricJudge({
      id: "rubric",
      criteria: [{ name: "solved", text: "Solved.", weight: 1, choices: ["no", "yes"] }],
      structured_output: true,
    }, endpoint);
    const t = trace();
    assert.equal(await judge.score({ prompt: "q" }, t), 1);
    const records = t.info.judge as JudgeRecord[];
    assert.match(
      records[0].error!,
      /judge answered "maybe" for "solved", expected one of "no", "yes"/,
    );
    const body = server.requests[0].body as unknown as Record<string, { type?: string }>;
    assert.equal(body.response_format?.type, "json_schema");
    assert.doesNotMatch(
      String(server.requests[0].body.messages[0].content),
      /Respond with ONLY a JSON object/,
    );
  } finally {
    await server.close();
  }
});

Deno.test("buildJudges(): clear errors name the entry: unknown id, duplicate names, non-finite weight, no endpoint, criteria files", async () => {
  const dir = await mkdtemp(join(tmpdir(), "vf-judges-"));
  try {
    await writeFile(join(dir, "bad.toml"), "[[criteria]]\nname = 'a'\n");
    const endpointOf = (e: { base_url?: string }) =>
      e.base_url ? { client: new OpenAIChatClient({ base_url: e.base_url }), model: "m" } : null;
    const cases: Array<[unknown[], RegExp]> = [
      [
        [{ id: "refrence" }],
        /^env\.judges\[0\]\.id: unknown judge "refrence"; known: "reference", "rubric"$/,
      ],
      [
        [{ id: "reference", base_url: "http://x", model: "m" }, {
          id: "reference",
          base_url: "http://x",
          model: "m",
        }],
        /^env\.judges\[1\]\.name: judges env\.judges\[0\] and env\.judges\[1\] share the reward key "reference"/,
      ],
      [
        [{ id: "reference", weight: Infinity, base_url: "http://x", model: "m" }],
        /^env\.judges\[0\]\.weight: must be a finite number/,
      ],
      [[{ id: "reference" }], /^env\.judges\[0\]: judge "reference" has no endpoint; set base_url/],
      [
        [{ id: "reference", base_url: "http://x" }],
        /^env\.judges\[0\]\.model: judge "reference" has its own base_url/,
      ],
      [
        [{ id: "rubric", path: "nope.toml", base_url: "http://x", model: "m" }],
        /^env\.judges\[0\]\.path: criteria file "nope\.toml" does not exist/,
      ],
      [
        [{ id: "rubric", path: "bad.toml", base_url: "http://x", model: "m" }],
        /^env\.judges\[0\]\.path: criteria file "bad\.toml": criteria\.0\.text: /,
      ],
      [
        [{ id: "reference", choices: ["yes", "YES"], base_url: "http://x", model: "m" }],
        /^env\.judges\[0\]\.choices: needs two distinct/,
      ],
    ];
    for (const [entries, pattern] of cases) {
      assert.throws(
        () => buildJudges([{ field: "env.judges", entries }], { baseDir: dir, endpointOf }),
        (e: unknown) => e instanceof ConfigError && pattern.test(e.message),
        JSON.stringify(entries),
      );
    }
    // Unique across both places.
    assert.throws(
      () =>
        buildJudges([
          { field: "env.judges", entries: [{ id: "reference", base_url: "http://x", model: "m" }] },
          {
            field: "env.taskset.task.judges",
            entries: [{ id: "reference", base_url: "http://x", model: "m" }],
          },
        ], { endpointOf }),
      /env\.taskset\.task\.judges\[0\]\.name: judges env\.judges\[0\] and env\.taskset\.task\.judges\[0\] share/,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

Deno.test("scoreVerdicts() scores each criterion's choice in the criteria's order; a bad verdict list is a JudgeVerdictError in the judge's own words", () => {
  const criteria = [
    { name: "correct", text: "Right.", weight: 3, choices: ["wrong", "partly", "right"] },
    { name: "tidy", text: "Tidy.", weight: 1, choices: ["no", "yes"] },
  ];
  const word = (fault: VerdictFault) => `fault ${fault.kind}`;
  const scores = scoreVerdicts(
    {
      verdicts: [{ name: "tidy", verdict: "no" }, { name: "correct", verdict: "partly" }],
    },
    criteria,
    word,
  );
  assert.deepEqual(Object.keys(scores), ["correct", "tidy"]);
  assert.deepEqual(scores, { correct: 0.5, tidy: 0 });
  assert.equal(weightedScore(criteria, scores), 0.375);
  assert.deepEqual(Object.entries(criterionMetrics("rubric", scores)), [
    ["rubric/correct", 0.5],
    ["rubric/tidy", 0],
  ]);
  const bad: Array<[unknown, string]> = [
    [null, "no_list"],
    [{ verdicts: "yes" }, "no_list"],
    [{ verdicts: [{ name: "other", verdict: "no" }] }, "unknown"],
    [{ verdicts: [{ name: "tidy", verdict: "no" }, { name: "tidy", verdict: "no" }] }, "repeated"],
    [{ verdicts: [{ name: "tidy", verdict: "maybe" }] }, "not_allowed"],
    [{ verdicts: [{ name: "tidy", verdict: "yes" }] }, "missing"],
  ];
  for (const [value, kind] of bad) {
    assert.throws(
      () => scoreVerdicts(value, criteria, word),
      (e) => e instanceof JudgeVerdictError && e.message === `fault ${kind}`,
      kind,
    );
  }
});
