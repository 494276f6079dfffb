import assert from "node:assert/strict";
import {
  type ChatCompletionBody,
  contextLengthReply,
  DEMO_NO_ANSWER_TEXT,
  demoResponder,
  lastUserText,
  type ModelServer,
  rateLimitReply,
  type Responder,
  scriptedResponder,
  startModelServer,
  systemText,
  textReply,
  toolCallReply,
  withModelServer,
} from "../../tests/model_server.ts";

function chatBody(user: string, extra: Partial<ChatCompletionBody> = {}): ChatCompletionBody {
  return { model: "test-model", messages: [{ role: "user", content: user }], ...extra };
}

async function post(
  server: ModelServer,
  body: unknown,
  init: { signal?: AbortSignal; apiKey?: string; headers?: Record<string, string> } = {},
): Promise<{ status: number; headers: Headers; text: string; json: () => unknown }> {
  const res = await fetch(`${server.url}/chat/completions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
      ...init.headers,
    },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: init.signal,
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) };
}

// deno-lint-ignore no-explicit-any
type Json = any;

Deno.test("startModelServer() answers with the chat.completion shape", async () => {
  await withModelServer(() => ({ content: "Hello there" }), async (server) => {
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    const res = await post(server, chatBody("hi"));
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "application/json");
    const body: Json = res.json();
    assert.equal(body.object, "chat.completion");
    assert.equal(typeof body.id, "string");
    assert.equal(typeof body.created, "number");
    assert.equal(body.model, "test-model");
    assert.equal(body.choices.length, 1);
    assert.deepEqual(body.choices[0].message, {
      role: "assistant",
      content: "Hello there",
      refusal: null,
    });
    assert.equal(body.choices[0].index, 0);
    assert.equal(body.choices[0].finish_reason, "stop");
    // "hi" is 2 chars -> 1 token; "Hello there" is 11 chars -> 3 tokens.
    assert.deepEqual(body.usage, { prompt_tokens: 1, completion_tokens: 3, total_tokens: 4 });
  });
});

Deno.test("startModelServer() sends tool calls with JSON-string arguments and finish_reason tool_calls", async () => {
  const responder = scriptedResponder([
    {
      tool_calls: [
        { name: "calculator", arguments: { expression: "2 + 2" } },
        { id: "call_fixed", name: "lookup", arguments: "{not json" },
      ],
    },
  ]);
  await withModelServer(responder, async (server) => {
    const body: Json = (await post(server, chatBody("add"))).json();
    const message = body.choices[0].message;
    assert.equal(message.content, null);
    assert.equal(body.choices[0].finish_reason, "tool_calls");
    assert.deepEqual(message.tool_calls, [
      {
        id: "call_0_0",
        type: "function",
        function: { name: "calculator", arguments: '{"expression":"2 + 2"}' },
      },
      { id: "call_fixed", type: "function", function: { name: "lookup", arguments: "{not json" } },
    ]);
  });
});

Deno.test("startModelServer() passes reasoning_content, finish_reason and usage through", async () => {
  const reply = textReply("short", {
    reasoning_content: "thinking",
    finish_reason: "length",
    usage: { prompt_tokens: 7, completion_tokens: 11 },
  });
  await withModelServer(() => reply, async (server) => {
    const body: Json = (await post(server, chatBody("q"))).json();
    assert.equal(body.choices[0].message.reasoning_content, "thinking");
    assert.equal(body.choices[0].finish_reason, "length");
    assert.deepEqual(body.usage, { prompt_tokens: 7, completion_tokens: 11, total_tokens: 18 });
  });
});

Deno.test("startModelServer() sends a 429 with retry-after and an OpenAI-style error", async () => {
  await withModelServer(
    scriptedResponder([rateLimitReply(2), { content: "ok" }]),
    async (server) => {
      const first = await post(server, chatBody("q"));
      assert.equal(first.status, 429);
      assert.equal(first.headers.get("retry-after"), "2");
      const error: Json = first.json();
      assert.equal(error.error.type, "rate_limit_error");
      assert.match(error.error.message, /Rate limit/);
      const second = await post(server, chatBody("q"));
      assert.equal(second.status, 200);
    },
  );
});

Deno.test("startModelServer() sends a 500 with a default error body", async () => {
  await withModelServer(() => ({ status: 500 }), async (server) => {
    const res = await post(server, chatBody("q"));
    assert.equal(res.status, 500);
    const body: Json = res.json();
    assert.equal(body.error.type, "server_error");
    assert.match(body.error.message, /500/);
  });
});

Deno.test("startModelServer() sends the context-length 400 verbatim", async () => {
  await withModelServer(() => contextLengthReply(4096, 5000), async (server) => {
    const res = await post(server, chatBody("q"));
    assert.equal(res.status, 400);
    const body: Json = res.json();
    assert.match(body.error.message, /^This model's maximum context length is 4096 tokens/);
    assert.equal(body.error.code, "context_length_exceeded");
  });
});

Deno.test("startModelServer() sends a raw body as application/json even when it is not JSON", async () => {
  await withModelServer(() => ({ raw: '{"choices": [' }), async (server) => {
    const res = await post(server, chatBody("q"));
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "application/json");
    assert.equal(res.text, '{"choices": [');
    assert.throws(() => res.json(), SyntaxError);
  });
});

Deno.test("startModelServer() waits delay_ms before answering", async () => {
  await withModelServer(() => ({ content: "late", delay_ms: 150 }), async (server) => {
    const started = performance.now();
    const res = await post(server, chatBody("q"));
    const elapsed = performance.now() - started;
    assert.equal(res.status, 200);
    assert.ok(elapsed >= 140, `answered after ${elapsed} ms`);
  });
});

Deno.test("startModelServer() hangs until the client aborts, then serves the next request", async () => {
  const responder = scriptedResponder([{ hang: true }, { content: "after" }]);
  await withModelServer(responder, async (server) => {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new Error("client gave up")), 100);
    await assert.rejects(post(server, chatBody("q"), { signal: controller.signal }));
    clearTimeout(timer);
    // The server notices the disconnect and releases the hanging handler by itself.
    const deadline = performance.now() + 2_000;
    while (server.inFlight > 0 && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(server.inFlight, 0);
    const next: Json = (await post(server, chatBody("q"))).json();
    assert.equal(next.choices[0].message.content, "after");
  });
});

Deno.test("ModelServer.close() releases requests that hang or wait, which get a 503", async () => {
  const server = await startModelServer({
    responder: scriptedResponder([{ hang: true }, { content: "x", delay_ms: 60_000 }]),
  });
  const hanging = post(server, chatBody("q1"));
  const waiting = post(server, chatBody("q2"));
  while (server.requests.length < 2) await new Promise((r) => setTimeout(r, 5));
  assert.equal(server.inFlight, 2);
  const started = performance.now();
  await server.close();
  assert.ok(performance.now() - started < 5_000);
  assert.equal((await hanging).status, 503);
  assert.equal((await waiting).status, 503);
  await server.close(); // idempotent
});

Deno.test("startModelServer() rejects requests without the configured API key with a 401", async () => {
  await withModelServer(() => ({ content: "secret ok" }), async (server) => {
    const none = await post(server, chatBody("q"));
    assert.equal(none.status, 401);
    assert.equal((none.json() as Json).error.code, "invalid_api_key");
    const wrong = await post(server, chatBody("q"), { apiKey: "sk-wrong-key-1234" });
    assert.equal(wrong.status, 401);
    assert.match(
      (wrong.json() as Json).error.message,
      /Incorrect API key provided: "sk-\.\.\.1234"/,
    );
    const models = await fetch(`${server.url}/models`);
    assert.equal(models.status, 401);
    await models.body?.cancel();
    const right = await post(server, chatBody("q"), { apiKey: "sk-test" });
    assert.equal(right.status, 200);
    assert.equal(server.requests.length, 1, "rejected requests are not recorded");
    assert.equal(server.requests[0].headers.authorization, "Bearer sk-test");
  }, { apiKey: "sk-test" });
});

Deno.test("startModelServer() records every request's body and headers in order", async () => {
  const seen: number[] = [];
  const responder: Responder = (request, { index }) => {
    seen.push(index);
    return { content: `reply to ${lastUserText(request)}` };
  };
  await withModelServer(responder, async (server) => {
    await post(server, chatBody("one", { temperature: 0.3 }), { headers: { "x-trace": "a" } });
    await post(server, chatBody("two", { max_tokens: 5 }), { headers: { "x-trace": "b" } });
    assert.deepEqual(seen, [0, 1]);
    assert.equal(server.requests.length, 2);
    assert.equal(server.requests[0].body.temperature, 0.3);
    assert.equal(server.requests[0].headers["x-trace"], "a");
    assert.equal(server.requests[1].body.max_tokens, 5);
    assert.equal(lastUserText(server.requests[1]), "two");
    assert.equal(server.requests[1].headers["content-type"], "application/json");
  });
});

Deno.test("startModelServer() numbers concurrent requests uniquely", async () => {
  await withModelServer((_, { index }) => ({ content: String(index) }), async (server) => {
    const replies = await Promise.all(
      Array.from({ length: 50 }, () => post(server, chatBody("q"))),
    );
    const indices = replies.map((r) => Number((r.json() as Json).choices[0].message.content));
    assert.deepEqual(indices.toSorted((a, b) => a - b), Array.from({ length: 50 }, (_, i) => i));
    assert.equal(server.requests.length, 50);
  });
});

Deno.test("startModelServer() streams a reply word by word, usage last when asked", async () => {
  await withModelServer(() => ({ content: "one two three" }), async (server) => {
    const res = await fetch(`${server.url}/chat/completions`, {
      method: "POST",
      body: JSON.stringify(
        chatBody("q", { stream: true, stream_options: { include_usage: true } }),
      ),
    });
    assert.match(res.headers.get("content-type") ?? "", /event-stream/);
    const events = (await res.text()).split("\n\n").filter(Boolean).map((e) => e.slice(6));
    assert.equal(events.at(-1), "[DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
    assert.equal(text, "one two three");
    assert.equal(chunks.filter((c) => c.choices[0]?.delta?.content).length, 3);
    assert.equal(chunks.at(-1).choices.length, 0);
    assert.ok(chunks.at(-1).usage.completion_tokens > 0);
    assert.ok(server.requests[0].finishedAt);
  });
});

Deno.test("startModelServer() refuses invalid JSON and unknown routes", async () => {
  await withModelServer(() => ({ content: "x" }), async (server) => {
    const bad = await post(server, "{oops");
    assert.equal(bad.status, 400);
    assert.match((bad.json() as Json).error.message, /not valid JSON/);
    const noMessages = await post(server, { model: "m" });
    assert.equal(noMessages.status, 400);
    const missing = await fetch(`${server.url}/completions`, { method: "POST", body: "{}" });
    assert.equal(missing.status, 404);
    await missing.body?.cancel();
    assert.equal(server.requests.length, 0);
  });
});

Deno.test("startModelServer() answers a 500 naming the error when the responder throws", async () => {
  await withModelServer(() => {
    throw new Error("boom");
  }, async (server) => {
    const res = await post(server, chatBody("q"));
    assert.equal(res.status, 500);
    assert.match((res.json() as Json).error.message, /Responder failed: boom/);
  });
});

Deno.test("GET /v1/models lists vf-demo and every model seen", async () => {
  await withModelServer(() => ({ content: "x" }), async (server) => {
    await post(server, chatBody("q", { model: "gpt-test" }));
    const res = await fetch(`${server.url}/models`);
    const body: Json = await res.json();
    assert.equal(body.object, "list");
    assert.deepEqual(body.data.map((m: Json) => m.id), ["vf-demo", "gpt-test"]);
  });
});

Deno.test("scriptedResponder() errors with 500 when exhausted, or loops, or repeats the last", async () => {
  await withModelServer(scriptedResponder([{ content: "a" }]), async (server) => {
    assert.equal((await post(server, chatBody("q"))).status, 200);
    const exhausted = await post(server, chatBody("q"));
    assert.equal(exhausted.status, 500);
    assert.match((exhausted.json() as Json).error.message, /Script exhausted/);
  });
  const looped = scriptedResponder([{ content: "a" }, { content: "b" }], { loop: true });
  const repeated = scriptedResponder([{ content: "a" }, { content: "b" }], { repeatLast: true });
  const request = { body: chatBody("q"), headers: {} };
  const contents = (r: Responder) =>
    Promise.all(
      [0, 1, 2, 3].map(async (index) => ((await r(request, { index })) as Json).content),
    );
  assert.deepEqual(await contents(looped), ["a", "b", "a", "b"]);
  assert.deepEqual(await contents(repeated), ["a", "b", "b", "b"]);
});

Deno.test("toolCallReply() and systemText() build and read wire messages", () => {
  assert.deepEqual(toolCallReply("f", { x: 1 }, { id: "c1" }), {
    content: null,
    tool_calls: [{ id: "c1", name: "f", arguments: { x: 1 } }],
  });
  const request = {
    headers: {},
    body: {
      model: "m",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: [{ type: "text", text: "part one" }, { type: "image_url" }] },
      ],
    },
  };
  assert.equal(systemText(request), "Be brief.");
  assert.equal(lastUserText(request), "part one");
});

Deno.test("withModelServer() closes the server when the body throws", async () => {
  let url = "";
  await assert.rejects(
    withModelServer(() => ({ content: "x" }), (server) => {
      url = server.url;
      throw new Error("test body failed");
    }),
    /test body failed/,
  );
  await assert.rejects(fetch(`${url}/models`));
});

Deno.test("startModelServer() closes when its signal aborts", async () => {
  const controller = new AbortController();
  const server = await startModelServer({
    responder: () => ({ content: "x" }),
    signal: controller.signal,
  });
  controller.abort();
  await server.close();
  await assert.rejects(fetch(`${server.url}/models`));
});

// --- demoResponder ---

const questions = Array.from({ length: 200 }, (_, i) => `What is ${i} plus ${i * 3}?`);
const answerKey = new Map(questions.map((q, i) => [q, String(i + i * 3)]));

function boxed(text: string): string | undefined {
  return text.match(/\\boxed\{([^}]*)\}$/)?.[1];
}

async function demoAnswers(seed: number, accuracy?: number): Promise<string[]> {
  return await withModelServer(
    demoResponder({ answers: answerKey, seed, accuracy }),
    async (server) => {
      const out: string[] = [];
      for (const question of questions) {
        const body: Json = (await post(server, {
          model: "vf-demo",
          messages: [
            { role: "system", content: "Think step by step and put the answer in \\boxed{}." },
            { role: "user", content: question },
          ],
        })).json();
        out.push(body.choices[0].message.content);
      }
      return out;
    },
  );
}

Deno.test("demoResponder() gives the same replies for the same questions and seed", async () => {
  const first = await demoAnswers(7);
  const second = await demoAnswers(7);
  assert.deepEqual(first, second);
  const otherSeed = await demoAnswers(8);
  assert.notDeepEqual(first, otherSeed);
});

Deno.test("demoResponder() is correct on about `accuracy` of the questions, wrong by one otherwise", async () => {
  for (const accuracy of [0.75, 0.3]) {
    const replies = await demoAnswers(0, accuracy);
    let correct = 0;
    replies.forEach((reply, i) => {
      const given = boxed(reply);
      assert.ok(given !== undefined, `no \\boxed{} in ${reply}`);
      const expected = answerKey.get(questions[i])!;
      if (given === expected) correct++;
      else assert.equal(given, String(Number(expected) + 1));
      assert.match(reply, /scripted demo model/);
    });
    const rate = correct / questions.length;
    assert.ok(Math.abs(rate - accuracy) < 0.1, `accuracy ${rate} for target ${accuracy}`);
  }
});

Deno.test("demoResponder() finds a question wrapped in instructions and takes a lookup function", async () => {
  const request = (content: string) => ({
    headers: {},
    body: { model: "m", messages: [{ role: "user", content }] },
  });
  const wrapped = demoResponder({ answers: answerKey, accuracy: 1 });
  const reply: Json = await wrapped(request(`Solve this.\n${questions[3]}\nThanks`), { index: 0 });
  assert.equal(boxed(reply.content), "12");
  const fn = demoResponder({
    answers: (q) => (q.includes("capital") ? "Paris" : undefined),
    accuracy: 0,
  });
  const wrong: Json = await fn(request("The capital of France?"), { index: 0 });
  assert.equal(boxed(wrong.content), "not Paris");
  const unknown: Json = await fn(request("Something else"), { index: 0 });
  assert.equal(unknown.content, DEMO_NO_ANSWER_TEXT);
  const noKey: Json = await demoResponder()(request("What is 2+2?"), { index: 0 });
  assert.equal(noKey.content, DEMO_NO_ANSWER_TEXT);
});

Deno.test("demoResponder() reverses text when the system prompt asks, perturbing the misses", async () => {
  const texts = Array.from({ length: 100 }, (_, i) => `Sample sentence number ${i}, with words.`);
  const responder = demoResponder({ accuracy: 0.75, seed: 1 });
  let correct = 0;
  for (const text of texts) {
    const reply: Json = await responder({
      headers: {},
      body: {
        model: "m",
        messages: [
          { role: "system", content: "Reverse the given text character by character." },
          { role: "user", content: text },
        ],
      },
    }, { index: 0 });
    const match = reply.content.match(/^<reversed_text>\n([\s\S]*)\n<\/reversed_text>$/);
    assert.ok(match, reply.content);
    const expected = Array.from(text).reverse().join("");
    if (match[1] === expected) correct++;
    else assert.equal(match[1].length, expected.length - 1);
  }
  assert.ok(correct >= 60 && correct <= 90, `${correct} of 100 reversed correctly`);
});

Deno.test("demoResponder() calls a calculator tool, then boxes its result", async () => {
  const tools = [{
    type: "function",
    function: { name: "calculator", parameters: { type: "object" } },
  }];
  await withModelServer(demoResponder(), async (server) => {
    const question = "A farmer has 12 * (3 + 4) apples. How many?";
    const first: Json = (await post(server, chatBody(question, { tools }))).json();
    const call = first.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, "calculator");
    assert.deepEqual(JSON.parse(call.function.arguments), { expression: "12 * (3 + 4)" });
    assert.equal(first.choices[0].finish_reason, "tool_calls");
    const second: Json = (await post(server, {
      model: "vf-demo",
      tools,
      messages: [
        { role: "user", content: question },
        first.choices[0].message,
        { role: "tool", tool_call_id: call.id, content: "84" },
      ],
    })).json();
    assert.equal(boxed(second.choices[0].message.content), "84");
    const plain: Json = (await post(server, chatBody("No numbers here", { tools }))).json();
    assert.deepEqual(
      JSON.parse(plain.choices[0].message.tool_calls[0].function.arguments),
      { expression: "No numbers here" },
    );
  });
});

Deno.test("startModelServer() keeps no requests with record: false but still counts them", async () => {
  await withModelServer((_, { index }) => ({ content: String(index) }), async (server) => {
    await post(server, chatBody("a"));
    const second: Json = (await post(server, chatBody("b"))).json();
    assert.equal(second.choices[0].message.content, "1");
    assert.equal(server.requests.length, 0);
  }, { record: false });
});
