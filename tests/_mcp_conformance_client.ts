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
if (context.idp_id_token) {
  // Cross-app access: the user's ID token from the enterprise identity provider.
  Deno.env.set("CONFORMANCE_CLIENT_SECRET", context.client_secret);
  Deno.env.set("CONFORMANCE_ID_TOKEN", context.idp_id_token);
  spec.oauth = {
    grant: "cross_app",
    client_id: context.client_id,
    client_secret: "${CONFORMANCE_CLIENT_SECRET}",
    id_token: "${CONFORMANCE_ID_TOKEN}",
    idp_token_endpoint: context.idp_token_endpoint,
    idp_client_id: context.idp_client_id,
  };
} else if (context.client_id) {
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
} else if (scenario.startsWith("auth/")) {
  // No credentials: the authorization-code grant, registering vf (or naming the client ID
  // metadata document the suite's authorization server expects, where it takes them).
  spec.oauth = {
    grant: "authorization_code",
    client_metadata_url: "https://conformance-test.local/client-metadata.json",
  };
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
  // Ends the session and closes every connection: the process then exits by itself, as the
  // suite waits for it to (tests/mcp_http_close_test.ts checks that it does).
  await box.close();
}
