import assert from "node:assert/strict";
import { join } from "node:path";
import { Toolbox } from "./toolbox.ts";

// A stdio MCP server whose one tool answers with the names of the variables it was started with.
const SERVER = `
import { McpServer } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js";
import { StdioServerTransport } from "npm:@modelcontextprotocol/sdk@^1.32.0/server/stdio.js";
const server = new McpServer({ name: "env", version: "1" });
server.registerTool("names", { description: "Variable names", inputSchema: {} },
  () => ({ content: [{ type: "text", text: JSON.stringify({
    names: Object.keys(Deno.env.toObject()),
    proxy: Deno.env.get("HTTPS_PROXY") ?? null,
  }) }] }));
await server.connect(new StdioServerTransport());
`;

Deno.test("a stdio toolset's server gets what fetching its packages needs (CA trust, registry, proxy), its own env, and no credentials", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf_toolbox_env_" });
  const set = {
    DENO_TLS_CA_STORE: "system", // how a server behind a TLS-inspecting network trusts its CA
    OPENAI_API_KEY: "sk-never-passed",
    VF_TOOLBOX_TEST_TOKEN: "never-passed",
    // A proxy goes through, its credentials do not (nothing listens there; nothing is fetched).
    HTTPS_PROXY: "http://someone:proxy-secret@127.0.0.1:9/",
  };
  const before = Object.fromEntries(Object.keys(set).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(set)) Deno.env.set(k, v);
  try {
    await Deno.writeTextFile(join(dir, "server.ts"), SERVER);
    const box = await Toolbox.open([{
      name: "env",
      command: Deno.execPath(),
      args: ["run", "-A", "server.ts"],
      cwd: dir,
      env: { OWN: "1" },
      timeout: 60,
    }], { state: {} });
    try {
      const result = await box.call("env_names", {});
      assert.equal(result.isError, false, result.text);
      const { names, proxy }: { names: string[]; proxy: string | null } = JSON.parse(result.text);
      assert.equal(proxy, "http://127.0.0.1:9/");
      assert.ok(names.includes("DENO_TLS_CA_STORE"), names.join(","));
      assert.ok(names.includes("OWN"), names.join(","));
      assert.ok(names.includes("PATH"), names.join(","));
      assert.ok(!names.includes("OPENAI_API_KEY"), names.join(","));
      assert.ok(!names.includes("VF_TOOLBOX_TEST_TOKEN"), names.join(","));
    } finally {
      await box.close();
    }
  } finally {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) Deno.env.delete(k);
      else Deno.env.set(k, v);
    }
    await Deno.remove(dir, { recursive: true });
  }
});
