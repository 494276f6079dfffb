/**
 * vf's MCP client as the conformance suite (`@modelcontextprotocol/conformance client`) runs
 * it: the server's URL is the last argument, the scenario is in MCP_CONFORMANCE_SCENARIO and
 * its credentials in MCP_CONFORMANCE_CONTEXT. The client is a URL toolset in a Toolbox, as a
 * run's config would give it (credentials through `${VAR}` templates); it lists the tools and
 * calls each one with arguments made from its schema, as a model would.
 */
import { Toolbox } from "../lib/tools/toolbox.ts";
import type { ToolsetSpec } from "../lib/tools/toolset.ts";

const url = Deno.args.at(-1)!;
const scenario = Deno.env.get("MCP_CONFORMANCE_SCENARIO") ?? "";
const context = JSON.parse(Deno.env.get("MCP_CONFORMANCE_CONTEXT") ?? "{}");

const spec: ToolsetSpec = { name: "conformance", url, timeout: 30 };
// The scenario's credentials reach the toolset as a run's secrets would: from the environment.
if (context.client_id) {
  Deno.env.set("CONFORMANCE_CLIENT_ID", context.client_id);
  spec.oauth = { client_id: "${CONFORMANCE_CLIENT_ID}" };
  if (context.client_secret) {
    Deno.env.set("CONFORMANCE_CLIENT_SECRET", context.client_secret);
    spec.oauth.client_secret = "${CONFORMANCE_CLIENT_SECRET}";
  }
  if (context.private_key_pem) {
    Deno.env.set("CONFORMANCE_PRIVATE_KEY", context.private_key_pem);
    spec.oauth.private_key = "${CONFORMANCE_PRIVATE_KEY}";
    spec.oauth.algorithm = context.signing_algorithm ?? "ES256";
  }
}
// A fixed answer the schema's defaults complete (the SEP-1034 scenario accepts with nothing).
if (scenario.startsWith("elicitation")) spec.elicitation = { accept: {} };

/** Arguments a model would give: each required property a plain value of its type. */
function argsFor(schema: Record<string, unknown>): Record<string, unknown> {
  const props = (schema.properties ?? {}) as Record<string, { type?: string; default?: unknown }>;
  const required = (schema.required ?? []) as string[];
  const out: Record<string, unknown> = {};
  for (const name of required) {
    const p = props[name] ?? {};
    out[name] = p.default ??
      (p.type === "number" || p.type === "integer"
        ? 1
        : p.type === "boolean"
        ? true
        : p.type === "object"
        ? {}
        : p.type === "array"
        ? []
        : "x");
  }
  return out;
}

const box = await Toolbox.open([spec], { state: {}, roots: [Deno.cwd()] });
try {
  for (const tool of box.tools) {
    const result = await box.call(tool.name, argsFor(tool.parameters));
    console.log(`${tool.name}: ${result.isError ? "error: " : ""}${result.text.slice(0, 200)}`);
  }
} finally {
  await box.close();
}
