/**
 * A URL toolset's connection pieces: its headers and OAuth provider with `${VAR}` templates
 * resolved at use ({@link httpOptions}), how long a request may wait for a person to authorize
 * ({@link authWait}), and its closing ({@link closeHttp}: the session ended, the transport and
 * the toolset's own connections closed).
 * @module
 */
import process from "node:process";
import { ConfigError } from "../errors.ts";
import { resolveTemplate } from "../config.ts";
import type { ToolsetSpec } from "./toolset.ts";
import {
  authCodeProvider,
  AUTHORIZE_TIMEOUT,
  checkRedirectUri,
  CrossAppProvider,
} from "./oauth.ts";

/** The environment, for `${VAR}` templates in a URL toolset's headers and OAuth. */
function fromEnv(name: string): string | undefined {
  return process.env[name];
}

/** A URL toolset's headers and OAuth provider, templates resolved now. */
export async function httpOptions(spec: ToolsetSpec, run: string | undefined) {
  const resolve = (value: string, field: string) => {
    try {
      return resolveTemplate(value, fromEnv);
    } catch (error) {
      throw new ConfigError(`Toolset "${spec.name}" ${field}: ${(error as Error).message}`);
    }
  };
  const headers = Object.fromEntries(
    Object.entries(spec.headers ?? {}).map(([k, v]) => [k, resolve(v, `headers.${k}`)]),
  );
  const o = spec.oauth;
  if (!o) return { requestInit: { headers } };
  const at = (k: Exclude<keyof typeof o, "authorize_timeout">) =>
    o[k] === undefined ? undefined : resolve(o[k]!, `oauth.${k}`);
  if (o.token !== undefined) {
    const token = at("token")!;
    const authProvider = {
      redirectUrl: undefined,
      clientMetadata: { redirect_uris: [], client_name: "vf" },
      clientInformation: () => undefined,
      tokens: () => ({ access_token: token, token_type: "Bearer" }),
      saveTokens: () => {},
      redirectToAuthorization: () => {
        throw new Error(`the server refused the token of oauth.token`);
      },
      saveCodeVerifier: () => {},
      codeVerifier: () => "",
    };
    return { requestInit: { headers }, authProvider };
  }
  if (o.grant === "authorization_code") {
    const redirectUri = at("redirect_uri");
    const problem = redirectUri === undefined ? undefined : checkRedirectUri(redirectUri);
    if (problem) throw new ConfigError(`Toolset "${spec.name}" oauth.redirect_uri: ${problem}`);
    const authProvider = authCodeProvider({
      toolset: spec.name,
      serverUrl: spec.url!,
      clientId: at("client_id"),
      clientSecret: at("client_secret"),
      clientMetadataUrl: at("client_metadata_url"),
      scope: at("scope"),
      redirectUri,
      authorizeTimeout: o.authorize_timeout ?? AUTHORIZE_TIMEOUT,
      run,
    });
    return { requestInit: { headers }, authProvider };
  }
  if (o.grant === "cross_app") {
    const authProvider = new CrossAppProvider({
      toolset: spec.name,
      clientId: at("client_id")!,
      clientSecret: at("client_secret")!,
      idToken: at("id_token")!,
      idpTokenEndpoint: at("idp_token_endpoint")!,
      idpClientId: at("idp_client_id"),
      scope: at("scope"),
    });
    return { requestInit: { headers }, authProvider };
  }
  const { ClientCredentialsProvider, PrivateKeyJwtProvider } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/client/auth-extensions.js"
  );
  const common = {
    clientId: at("client_id")!,
    clientName: "vf",
    scope: at("scope"),
    ...(o.issuer ? { expectedIssuer: at("issuer")! } : {}),
  };
  const authProvider = o.private_key !== undefined
    ? new PrivateKeyJwtProvider({
      ...common,
      privateKey: at("private_key")!,
      algorithm: at("algorithm") ?? "ES256",
    })
    : new ClientCredentialsProvider({ ...common, clientSecret: at("client_secret")! });
  return { requestInit: { headers }, authProvider };
}

/** Seconds a request may wait for a person to authorize the toolset. */
export function authWait(spec: ToolsetSpec): number {
  return spec.oauth?.grant === "authorization_code"
    ? spec.oauth.authorize_timeout ?? AUTHORIZE_TIMEOUT
    : 0;
}

/** Seconds a closing URL toolset waits for the server to end its session. */
const TERMINATE_WAIT = 10;

/**
 * A URL toolset's closing: the session ended with a DELETE (as the spec asks of a client that
 * is done with one; a server without sessions, or one answering 405, is left as it is), then
 * the transport closed (which aborts its GET stream and any request still out), then the
 * connections of its own HTTP client closed: a keep-alive socket of a shared pool would stay
 * open on the server, one per rollout, until the pool's idle timeout.
 */
export function closeHttp(
  client: { close(): Promise<void> },
  transport: { terminateSession(): Promise<void> },
  http: Deno.HttpClient,
): () => Promise<void> {
  let closing: Promise<void> | undefined;
  return () =>
    closing ??= (async () => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      try {
        await Promise.race([
          transport.terminateSession().catch(() => {}),
          new Promise<void>((r) => timer = setTimeout(r, TERMINATE_WAIT * 1000)),
        ]);
      } finally {
        clearTimeout(timer);
        await client.close().catch(() => {});
        http.close();
      }
    })();
}
