/**
 * The authorization-code grant of a URL toolset against a real authorization server and MCP
 * server on loopback (the SDK's server behind a bearer check): completed headlessly when the
 * server redirects straight back, the token shared by later rollouts and refreshed rather than
 * re-authorized; a login page printed once and waited for on vf's loopback redirect URI (the
 * test plays the person); nobody coming is an infra error; a refusal names itself; and what bad
 * entries are told. The conformance suite (tests/mcp_conformance_test.ts) covers discovery,
 * registration, scopes and client authentication.
 * @module
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { InfraError } from "../lib/errors.ts";
import { loadToolsets } from "../lib/tools/config.ts";
import { Toolbox } from "../lib/tools/toolbox.ts";
import type { ToolsetSpec } from "../lib/tools/toolset.ts";

type Mode = "redirect" | "page" | "deny";

/** An authorization server and a protected MCP server on one loopback origin. */
async function startServers(mode: Mode) {
  const { McpServer } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js");
  const { WebStandardStreamableHTTPServerTransport } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/server/webStandardStreamableHttp.js"
  );
  const authorizations: Array<{ state: string; redirect: string; code: string }> = [];
  const grants: string[] = [];
  const codes = new Map<string, string>(); // code -> PKCE challenge
  const refresh = new Set<string>();
  const valid = new Set<string>();
  let n = 0;
  let origin = "";
  const json = (body: unknown, status = 200) => Response.json(body, { status });
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    const url = new URL(req.url);
    if (url.pathname === "/.well-known/oauth-protected-resource/mcp") {
      return json({ resource: `${origin}/mcp`, authorization_servers: [origin] });
    }
    if (url.pathname === "/.well-known/oauth-authorization-server") {
      return json({
        issuer: origin,
        authorization_endpoint: `${origin}/authorize`,
        token_endpoint: `${origin}/token`,
        registration_endpoint: `${origin}/register`,
        response_types_supported: ["code"],
        grant_types_supported: ["authorization_code", "refresh_token"],
        code_challenge_methods_supported: ["S256"],
        token_endpoint_auth_methods_supported: ["none"],
      });
    }
    if (url.pathname === "/register") {
      const body = await req.json();
      return json({ ...body, client_id: `client-${++n}`, token_endpoint_auth_method: "none" }, 201);
    }
    if (url.pathname === "/authorize") {
      const q = url.searchParams;
      const code = `code-${++n}`;
      codes.set(code, q.get("code_challenge")!);
      const back = new URL(q.get("redirect_uri")!);
      authorizations.push({ state: q.get("state")!, redirect: back.href, code });
      if (mode === "page") {
        return new Response("<form>Sign in</form>", { headers: { "content-type": "text/html" } });
      }
      if (mode === "deny") back.searchParams.set("error", "access_denied");
      else back.searchParams.set("code", code);
      back.searchParams.set("state", q.get("state")!);
      return Response.redirect(back.href, 302);
    }
    if (url.pathname === "/token") {
      const form = new URLSearchParams(await req.text());
      const grant = form.get("grant_type")!;
      grants.push(grant);
      if (grant === "authorization_code") {
        const challenge = codes.get(form.get("code")!);
        codes.delete(form.get("code")!);
        const verifier = form.get("code_verifier") ?? "";
        if (!challenge || createHash("sha256").update(verifier).digest("base64url") !== challenge) {
          return json({ error: "invalid_grant" }, 400);
        }
      } else if (grant !== "refresh_token" || !refresh.delete(form.get("refresh_token")!)) {
        return json({ error: "invalid_grant" }, 400);
      }
      const access = `access-${++n}`;
      const again = `refresh-${n}`;
      valid.add(access);
      refresh.add(again);
      return json({
        access_token: access,
        token_type: "Bearer",
        expires_in: 3600,
        refresh_token: again,
      });
    }
    const token = req.headers.get("authorization")?.replace(/^Bearer /, "");
    if (!token || !valid.has(token)) {
      return new Response(JSON.stringify({ error: "invalid_token" }), {
        status: 401,
        headers: {
          "www-authenticate":
            `Bearer resource_metadata="${origin}/.well-known/oauth-protected-resource/mcp"`,
        },
      });
    }
    // No server-to-client stream: an open one would hold the server's shutdown.
    if (req.method === "GET") return new Response(null, { status: 405 });
    const mcp = new McpServer({ name: "guarded", version: "1" });
    mcp.registerTool("whoami", { description: "Who the token is", inputSchema: {} }, () => ({
      content: [{ type: "text", text: `token ${token}` }],
    }));
    const transport = new WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: true,
    });
    await mcp.connect(transport);
    return await transport.handleRequest(req);
  });
  origin = `http://127.0.0.1:${server.addr.port}`;
  return {
    url: `${origin}/mcp`,
    authorizations,
    grants,
    /** The access tokens expire (the refresh tokens stay good). */
    expire: () => valid.clear(),
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

function freeRedirect(): string {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return `http://127.0.0.1:${port}/callback`;
}

/** Poll until `fn` holds; generous, for a loaded machine. */
async function until<T>(fn: () => Promise<T | undefined> | T | undefined, what: string) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const got = await fn();
    if (got !== undefined) return got;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`Timed out waiting for ${what}`);
}

async function callOnce(spec: ToolsetSpec, run?: string): Promise<string> {
  const box = await Toolbox.open([spec], { state: {}, run });
  try {
    return (await box.call(`${spec.name}_whoami`, {})).text;
  } finally {
    await box.close();
  }
}

Deno.test("an authorization-code toolset authorizes headlessly when the server redirects straight back; later rollouts reuse the token and refresh it instead of authorizing again", async () => {
  await using servers = await startServers("redirect");
  const spec: ToolsetSpec = {
    name: "guarded",
    url: servers.url,
    oauth: { grant: "authorization_code" },
  };
  const first = await callOnce(spec);
  assert.match(first, /^token access-\d+$/);
  assert.equal(servers.authorizations.length, 1);
  assert.deepEqual(servers.grants, ["authorization_code"]);
  // Another rollout: the run's token, no new authorization.
  assert.equal(await callOnce(spec), first);
  assert.equal(servers.authorizations.length, 1);
  // The token expires: the refresh token gets a new one, still without a person.
  servers.expire();
  const third = await callOnce(spec);
  assert.match(third, /^token access-\d+$/);
  assert.notEqual(third, first);
  assert.deepEqual(servers.grants, ["authorization_code", "refresh_token"]);
  assert.equal(servers.authorizations.length, 1);
  // The spec keeps no token.
  assert.deepEqual(spec.oauth, { grant: "authorization_code" });
});

Deno.test("two runs in one process authorize separately; a run's rollouts share its token", async () => {
  await using servers = await startServers("redirect");
  const spec: ToolsetSpec = {
    name: "perrun",
    url: servers.url,
    oauth: { grant: "authorization_code" },
  };
  const run = `run-${crypto.randomUUID()}`;
  const first = await callOnce(spec, run);
  assert.equal(await callOnce(spec, run), first);
  assert.equal(servers.authorizations.length, 1);
  // Another run in the same process (a second `vf eval`, another served taskset): its own
  // authorization and token, never the first run's.
  const other = await callOnce(spec, `run-${crypto.randomUUID()}`);
  assert.equal(servers.authorizations.length, 2);
  assert.deepEqual(servers.grants, ["authorization_code", "authorization_code"]);
  assert.notEqual(other, first);
  // The first run still has its own.
  assert.equal(await callOnce(spec, run), first);
  assert.equal(servers.authorizations.length, 2);
});

Deno.test("a server that shows a login page is asked once for concurrent rollouts, and vf takes the person's redirect on its loopback redirect URI", async () => {
  await using servers = await startServers("page");
  const spec: ToolsetSpec = {
    name: "login",
    url: servers.url,
    oauth: { grant: "authorization_code", authorize_timeout: 120 },
  };
  const opened = Promise.all([callOnce(spec), callOnce(spec)]);
  // The person: opens the printed URL, signs in, and the browser follows the redirect to vf.
  const asked = await until(() => servers.authorizations[0], "the authorization request");
  const back = new URL(asked.redirect);
  assert.equal(back.hostname, "127.0.0.1");
  assert.equal(back.pathname, "/callback");
  back.searchParams.set("code", asked.code);
  back.searchParams.set("state", asked.state);
  const page = await until(async () => {
    try {
      const res = await fetch(back);
      return await res.text();
    } catch {
      return undefined; // vf is not listening yet
    }
  }, "vf's redirect listener");
  assert.match(page, /vf is authorized/);
  const [a, b] = await opened;
  assert.match(a, /^token access-\d+$/);
  assert.equal(b, a);
  assert.equal(servers.authorizations.length, 1);
  // The listener is gone once the code came.
  await assert.rejects(fetch(back));
});

Deno.test("nobody completing an authorization within oauth.authorize_timeout is an infra error naming the toolset and key; a refusal is one too", async () => {
  await using servers = await startServers("page");
  const redirect = freeRedirect();
  const started = Date.now();
  await assert.rejects(
    callOnce({
      name: "nobody",
      url: servers.url,
      oauth: { grant: "authorization_code", authorize_timeout: 2, redirect_uri: redirect },
    }),
    (error: Error) => {
      assert.ok(error instanceof InfraError, String(error));
      assert.match(
        error.message,
        /Toolset "nobody" did not start or list its tools: .*Nobody completed the authorization within 2 s \(oauth\.authorize_timeout\)/,
      );
      return true;
    },
  );
  assert.ok(Date.now() - started >= 2000);
  assert.equal(servers.authorizations[0].redirect, redirect);
  await assert.rejects(fetch(redirect)); // nothing left listening
  await using denying = await startServers("deny");
  await assert.rejects(
    callOnce({ name: "denied", url: denying.url, oauth: { grant: "authorization_code" } }),
    /Toolset "denied" did not start or list its tools: .*The authorization server refused: access_denied/,
  );
});

Deno.test("authorization-code and cross-app oauth entries are checked key by key", async () => {
  const url = "http://x/mcp";
  const cases: Array<[Record<string, unknown>, RegExp]> = [
    [{ grant: "password" }, /oauth\.grant: "password" is not a grant vf makes/],
    [
      { grant: "authorization_code", private_key: "k" },
      /oauth\.private_key: not a key of the authorization_code grant/,
    ],
    [
      { grant: "authorization_code", redirect_uri: "https://vf.example/callback" },
      /oauth\.redirect_uri: "https:\/\/vf\.example\/callback" is not a loopback address/,
    ],
    [
      { grant: "authorization_code", redirect_uri: "http://127.0.0.1/callback" },
      /oauth\.redirect_uri: .* names no port/,
    ],
    [
      { grant: "authorization_code", client_metadata_url: "http://vf.example/client.json" },
      /oauth\.client_metadata_url: .* is not an https URL with a path/,
    ],
    [
      { grant: "authorization_code", authorize_timeout: "60" },
      /oauth\.authorize_timeout: expected seconds \(a number\)/,
    ],
    [
      { grant: "authorization_code", client_secret: "s" },
      /oauth\.client_secret: give the client_id it belongs to/,
    ],
    [
      { grant: "cross_app", client_id: "c", client_secret: "s", id_token: "t" },
      /oauth\.idp_token_endpoint: required by the cross_app grant/,
    ],
    [
      { client_id: "c", client_secret: "s", redirect_uri: "http://127.0.0.1:1/cb" },
      /oauth\.redirect_uri: not a key of the client_credentials grant/,
    ],
  ];
  for (const [oauth, pattern] of cases) {
    await assert.rejects(
      loadToolsets([{ name: "a", url, oauth }], "."),
      (error: Error) => {
        assert.match(error.message, /^env\.toolsets\[0\]\.oauth/, JSON.stringify(oauth));
        assert.match(error.message, pattern, JSON.stringify(oauth));
        return true;
      },
    );
  }
  const [ok] = await loadToolsets([{
    name: "a",
    url,
    oauth: {
      grant: "authorization_code",
      client_id: "${ID}",
      redirect_uri: "http://127.0.0.1:8765/callback",
      authorize_timeout: 60,
      scope: "read",
    },
  }], ".");
  assert.deepEqual(ok.oauth, {
    grant: "authorization_code",
    client_id: "${ID}",
    redirect_uri: "http://127.0.0.1:8765/callback",
    authorize_timeout: 60,
    scope: "read",
  });
});
