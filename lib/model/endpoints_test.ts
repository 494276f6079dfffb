import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ChatClient, ChatRequestOptions } from "./client.ts";
import { type Endpoint, loadEndpoints, RoundRobinClient } from "./endpoints.ts";
import { ConfigError } from "../errors.ts";
import type { Messages, Response } from "../types.ts";

async function withRegistry(
  text: string,
  fn: (path: string) => Promise<void>,
): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "vf-endpoints-test-"));
  try {
    const path = join(dir, "endpoints.toml");
    await writeFile(path, text);
    await fn(path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Load `text` as a registry and return it as a plain object. */
async function load(text: string): Promise<Record<string, Endpoint[]>> {
  let result: Record<string, Endpoint[]> = {};
  await withRegistry(text, async (path) => {
    const map = await loadEndpoints(path);
    result = JSON.parse(JSON.stringify(Object.fromEntries(map)));
  });
  return result;
}

/** Assert that loading `text` fails with a ConfigError whose message, minus the path, is `message`. */
async function rejectsWith(text: string, message: string | RegExp): Promise<void> {
  await withRegistry(text, async (path) => {
    await assert.rejects(() => loadEndpoints(path), (e: unknown) => {
      assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${e}`);
      assert.ok(e.message.startsWith(`${path}`), e.message);
      const rest = e.message.slice(path.length);
      if (typeof message === "string") assert.equal(rest, message);
      else assert.match(rest, message);
      return true;
    });
  });
}

type TomlValue = string | Record<string, string>;

/** A registry file: one `[[endpoint]]` table per entry, in order; values as TOML strings. */
function endpoints(...entries: Record<string, TomlValue>[]): string {
  const toml = (v: TomlValue): string =>
    typeof v === "string"
      ? JSON.stringify(v)
      : `{ ${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)} = ${toml(x)}`).join(", ")} }`;
  const table = (entry: Record<string, TomlValue>) =>
    ["[[endpoint]]", ...Object.entries(entry).map(([k, v]) => `${k} = ${toml(v)}`)].join("\n");
  return entries.map(table).join("\n\n") + "\n";
}

/** Entry "a" with model "m", the start of most entries below. */
const ENTRY_A = { endpoint_id: "a", model: "m" };

// ---- registry parsing -------------------------------------------------------------------

Deno.test("loadEndpoints() maps each endpoint_id to its entry", async () => {
  const registry = await load(`
[[endpoint]]
endpoint_id = "mini"
model = "openai/gpt-4.1-mini"
url = "https://api.example.com/v1"
key = "EXAMPLE_API_KEY"

[[endpoint]]
endpoint_id = "local"
model = "qwen3"
url = "http://127.0.0.1:8000/v1"
key = "VLLM_API_KEY"
headers = { "X-Team" = "evals" }
`);
  assert.deepEqual(registry, {
    mini: [{
      model: "openai/gpt-4.1-mini",
      url: "https://api.example.com/v1",
      key: "EXAMPLE_API_KEY",
    }],
    local: [{
      model: "qwen3",
      url: "http://127.0.0.1:8000/v1",
      key: "VLLM_API_KEY",
      headers: { "X-Team": "evals" },
    }],
  });
});

Deno.test("loadEndpoints() accepts api_base_url, api_key_var and extra_headers as aliases", async () => {
  const registry = await load(endpoints({
    ...ENTRY_A,
    api_base_url: "http://h/v1",
    api_key_var: "K",
    extra_headers: { "X-A": "1" },
  }));
  assert.deepEqual(registry.a, [{
    model: "m",
    url: "http://h/v1",
    key: "K",
    headers: { "X-A": "1" },
  }]);
});

Deno.test("loadEndpoints() reads an entry's max_output_tokens and reasoning, and rejects a bad one", async () => {
  const registry = await load(`
[[endpoint]]
endpoint_id = "small"
model = "qwen"
url = "http://127.0.0.1:8000/v1"
key = "K"
max_output_tokens = 2048
reasoning = true
`);
  assert.deepEqual(registry.small, [{
    model: "qwen",
    url: "http://127.0.0.1:8000/v1",
    key: "K",
    max_output_tokens: 2048,
    reasoning: true,
  }]);
  await assert.rejects(
    load(`
[[endpoint]]
endpoint_id = "small"
model = "qwen"
url = "http://127.0.0.1:8000/v1"
key = "K"
max_output_tokens = 0
`),
    /endpoint\[0\]\.max_output_tokens/,
  );
});

Deno.test("loadEndpoints() accepts a field and its alias when they agree", async () => {
  const registry = await load(endpoints({
    ...ENTRY_A,
    url: "http://h/v1",
    api_base_url: "http://h/v1",
    key: "K",
    api_key_var: "K",
    type: "openai_chat_completions",
    api_client_type: "openai_chat_completions",
  }));
  assert.deepEqual(registry.a, [{ model: "m", url: "http://h/v1", key: "K" }]);
});

Deno.test("loadEndpoints() rejects url and api_base_url that disagree", async () => {
  await rejectsWith(
    endpoints({ ...ENTRY_A, url: "http://one/v1", api_base_url: "http://two/v1", key: "K" }),
    ": endpoint[0]: url and api_base_url disagree",
  );
});

Deno.test("loadEndpoints() rejects key and api_key_var that disagree", async () => {
  await rejectsWith(
    endpoints({ ...ENTRY_A, url: "http://h/v1", key: "ONE", api_key_var: "TWO" }),
    ": endpoint[0]: key and api_key_var disagree",
  );
});

Deno.test("loadEndpoints() rejects headers and extra_headers given together", async () => {
  await rejectsWith(
    endpoints({
      ...ENTRY_A,
      url: "http://h/v1",
      key: "K",
      headers: { "X-A": "1" },
      extra_headers: { "X-B": "2" },
    }),
    ": endpoint[0]: give headers or extra_headers, not both",
  );
});

Deno.test("loadEndpoints() groups repeated endpoint_ids as replicas in file order", async () => {
  const registry = await load(endpoints(
    { endpoint_id: "pool", model: "qwen3", url: "http://gpu1:8000/v1", key: "K" },
    { endpoint_id: "other", model: "x", url: "http://x/v1", key: "K" },
    { endpoint_id: "pool", model: "qwen3", url: "http://gpu2:8000/v1", key: "K" },
  ));
  assert.deepEqual(registry.pool.map((e) => e.url), ["http://gpu1:8000/v1", "http://gpu2:8000/v1"]);
  assert.equal(registry.other.length, 1);
});

Deno.test("loadEndpoints() rejects two models under one endpoint_id", async () => {
  await rejectsWith(
    endpoints(
      { endpoint_id: "pool", model: "qwen3", url: "http://gpu1/v1", key: "K" },
      { endpoint_id: "pool", model: "llama", url: "http://gpu2/v1", key: "K" },
    ),
    ': endpoint "pool" maps to two models ("qwen3", "llama")',
  );
});

Deno.test("loadEndpoints() requires a url (or api_base_url) and a key (or api_key_var)", async () => {
  await rejectsWith(endpoints({ ...ENTRY_A, key: "K" }), ": endpoint[0].url: required");
  const keyless = { ...ENTRY_A, url: "http://h/v1" };
  await rejectsWith(
    endpoints(keyless, { ...keyless, endpoint_id: "b" }),
    ": endpoint[0].key: required",
  );
});

Deno.test("loadEndpoints() requires a non-empty endpoint_id and model, naming the entry", async () => {
  await rejectsWith(
    endpoints({ ...ENTRY_A, url: "u", key: "K" }, { model: "m", url: "u", key: "K" }),
    /^: endpoint\[1\]\.endpoint_id: /,
  );
  await rejectsWith(
    endpoints({ endpoint_id: "a", model: "", url: "u", key: "K" }),
    /^: endpoint\[0\]\.model: /,
  );
});

Deno.test("loadEndpoints() rejects an unknown key such as the legacy client_type", async () => {
  await rejectsWith(
    endpoints({ ...ENTRY_A, url: "u", key: "K", client_type: "openai_chat_completions" }),
    /^: endpoint\[0\]: .*"client_type"/,
  );
});

Deno.test("loadEndpoints() rejects an unsupported client type", async () => {
  await rejectsWith(
    endpoints({ ...ENTRY_A, url: "u", key: "K", type: "carrier_pigeon" }),
    /^: endpoint\[0\]\.type: /,
  );
});

Deno.test("loadEndpoints() rejects a file without [[endpoint]] tables", async () => {
  await rejectsWith('model = "m"\n', ": expected [[endpoint]] tables");
  await rejectsWith('[endpoint]\nmodel = "m"\n', ": expected [[endpoint]] tables");
});

Deno.test("loadEndpoints() reports malformed TOML with the file and line", async () => {
  await rejectsWith('[[endpoint]]\nendpoint_id = "a\n', /^:2: invalid TOML: /);
});

// ---- RoundRobinClient -------------------------------------------------------------------

interface Call {
  prompt: Messages;
  model: string;
  options?: ChatRequestOptions;
}

/** A caller-provided ChatClient that records its calls and answers with its name. */
function recordingClient(name: string, calls: Array<Call & { client: string }>): ChatClient {
  return {
    baseUrl: `http://${name}/v1`,
    headersFromState: { "X-Session-ID": `${name}_key` },
    getResponse(prompt, model, options) {
      calls.push({ client: name, prompt, model, options });
      const response: Response = {
        id: name,
        created: 0,
        model,
        usage: null,
        message: { role: "assistant", content: name, finish_reason: "stop", is_truncated: false },
      };
      return Promise.resolve(response);
    },
  };
}

Deno.test("RoundRobinClient sends requests to its clients in turn", async () => {
  const calls: Array<Call & { client: string }> = [];
  const rr = new RoundRobinClient(["a", "b", "c"].map((n) => recordingClient(n, calls)));
  const ids: string[] = [];
  for (let i = 0; i < 7; i++) ids.push((await rr.getResponse([], "m")).id);
  assert.deepEqual(ids, ["a", "b", "c", "a", "b", "c", "a"]);
});

Deno.test("RoundRobinClient rotates concurrent requests too", async () => {
  const calls: Array<Call & { client: string }> = [];
  const rr = new RoundRobinClient(["a", "b"].map((n) => recordingClient(n, calls)));
  await Promise.all(Array.from({ length: 4 }, () => rr.getResponse([], "m")));
  assert.deepEqual(calls.map((c) => c.client), ["a", "b", "a", "b"]);
});

Deno.test("RoundRobinClient passes prompt, model and options through unchanged", async () => {
  const calls: Array<Call & { client: string }> = [];
  const rr = new RoundRobinClient([recordingClient("a", calls)]);
  const prompt: Messages = [{ role: "user", content: "hi" }];
  const options: ChatRequestOptions = { samplingArgs: { temperature: 0 }, headers: { "X-A": "1" } };
  await rr.getResponse(prompt, "qwen3", options);
  assert.equal(calls[0].prompt, prompt);
  assert.equal(calls[0].model, "qwen3");
  assert.equal(calls[0].options, options);
});

Deno.test("RoundRobinClient joins its clients' base URLs and uses the first one's state headers", () => {
  const rr = new RoundRobinClient(["a", "b"].map((n) => recordingClient(n, [])));
  assert.equal(rr.baseUrl, "http://a/v1,http://b/v1");
  assert.deepEqual(rr.headersFromState, { "X-Session-ID": "a_key" });
});

Deno.test("RoundRobinClient rejects an empty list of clients", () => {
  assert.throws(() => new RoundRobinClient([]), RangeError);
});

Deno.test("RoundRobinClient lets a replica's failure reach the caller and moves on", async () => {
  const calls: Array<Call & { client: string }> = [];
  const failing: ChatClient = {
    baseUrl: "http://down/v1",
    headersFromState: {},
    getResponse: () => Promise.reject(new Error("replica down")),
  };
  const rr = new RoundRobinClient([failing, recordingClient("b", calls)]);
  await assert.rejects(() => rr.getResponse([], "m"), /replica down/);
  assert.equal((await rr.getResponse([], "m")).id, "b");
});
