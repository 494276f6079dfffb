/**
 * OAuth grants of a URL toolset that a user would otherwise complete in a browser, made to fit
 * an unattended run:
 *
 * - the authorization-code grant (PKCE S256, resource indicators, dynamic client registration
 *   or a client ID metadata document, scope step-up, refresh tokens). The redirect URI is a
 *   loopback address of vf's (`http://127.0.0.1:<port>/callback`). vf fetches the authorization
 *   URL itself: a server that redirects straight back with a code completes headlessly;
 *   otherwise the URL is printed once, for a person to open, and vf listens on the loopback
 *   address for the redirect, up to `authorize_timeout` seconds;
 * - cross-app access (the enterprise-managed grant): an ID token of the user's identity
 *   provider exchanged there for an identity assertion grant (RFC 8693), which the
 *   authorization server takes as a JWT bearer grant (RFC 7523).
 *
 * Tokens and registrations live in this process's memory, one cache entry per run and toolset
 * configuration, shared by the run's rollouts (a `vf serve` server is one run); they are never
 * written to a file, and two runs in one process never share them.
 * @module
 */
import { createHash, randomBytes } from "node:crypto";
import { ConfigError } from "../errors.ts";
import type { ToolsetOAuth } from "./toolset.ts";
import type {
  StreamableHTTPClientTransport as HttpTransport,
} from "npm:@modelcontextprotocol/sdk@^1.32.0/client/streamableHttp.js";

// The shapes of the SDK's OAuth types that are read here (its subpath types do not resolve).
type OAuthClientMetadata = { redirect_uris: string[]; [key: string]: unknown };
type OAuthTokens = { access_token: string; refresh_token?: string; [key: string]: unknown };
type OAuthClientInformationMixed = { client_id: string; [key: string]: unknown };
type OAuthDiscoveryState = {
  authorizationServerUrl: string;
  resourceMetadataUrl?: string;
  resourceMetadata?: { resource?: string };
  authorizationServerMetadata?: { issuer?: string; scopes_supported?: string[] };
};

/** Seconds vf waits for a person to complete an authorization, by default. */
export const AUTHORIZE_TIMEOUT = 300;

/** What an authorization-code provider needs (template values already resolved). */
export interface AuthCodeOptions {
  /** The toolset's name, for messages. */
  toolset: string;
  /** The MCP server's URL. */
  serverUrl: string;
  /** A pre-registered client; without one vf registers (RFC 7591) or uses `clientMetadataUrl`. */
  clientId?: string;
  clientSecret?: string;
  /** An HTTPS URL of a client ID metadata document, used where the server supports them. */
  clientMetadataUrl?: string;
  /** Scopes to ask for when neither the server's challenge nor its metadata names any. */
  scope?: string;
  /** The loopback redirect URI; default `http://127.0.0.1:<a free port>/callback`. */
  redirectUri?: string;
  /** Seconds to wait for a person; default {@link AUTHORIZE_TIMEOUT}. */
  authorizeTimeout?: number;
  /** Where the authorization URL is shown to a person; default stderr. */
  notify?: (message: string) => void;
  /**
   * The run whose rollouts share the provider (its run id); without one, the process's
   * toolboxes opened without a run share one.
   */
  run?: string;
}

/** Runs kept at most: the oldest run's tokens go first (a process rarely holds many runs). */
const RUNS_KEPT = 64;

/** Per run, the providers by toolset configuration (a Map keeps the runs' order of arrival). */
const cache = new Map<string, Map<string, AuthCodeProvider>>();

/**
 * The run's provider for this toolset configuration: one per run and configuration, so the
 * run's rollouts share its registration and tokens (and a person is asked once), and another
 * run authorizes again.
 */
export function authCodeProvider(options: AuthCodeOptions): AuthCodeProvider {
  const run = options.run ?? "";
  let providers = cache.get(run);
  if (!providers) {
    cache.set(run, providers = new Map());
    while (cache.size > RUNS_KEPT) cache.delete(cache.keys().next().value!);
  }
  const key = createHash("sha256").update(JSON.stringify([
    options.serverUrl,
    options.clientId,
    options.clientSecret,
    options.clientMetadataUrl,
    options.scope,
    options.redirectUri,
  ])).digest("hex");
  let provider = providers.get(key);
  if (!provider) providers.set(key, provider = new AuthCodeProvider(options));
  provider.notify = options.notify ?? provider.notify;
  provider.authorizeTimeout = options.authorizeTimeout ?? AUTHORIZE_TIMEOUT;
  return provider;
}

/** A loopback redirect URI vf can listen on: `http://127.0.0.1|localhost|[::1]:<port>/<path>`. */
export function checkRedirectUri(value: string): string | undefined {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return `"${value}" is not a URL`;
  }
  if (url.protocol !== "http:" || !["127.0.0.1", "localhost", "[::1]"].includes(url.hostname)) {
    return `"${value}" is not a loopback address vf can listen on ` +
      `(http://127.0.0.1:<port>/<path>)`;
  }
  if (!url.port) return `"${value}" names no port`;
  return undefined;
}

const GRANTS = ["client_credentials", "authorization_code", "cross_app"];

/** The keys of each OAuth grant besides `grant`, `scope` and `issuer`. */
const GRANT_KEYS: Record<string, string[]> = {
  client_credentials: ["client_id", "client_secret", "private_key", "algorithm"],
  authorization_code: [
    "client_id",
    "client_secret",
    "client_metadata_url",
    "redirect_uri",
    "authorize_timeout",
  ],
  cross_app: ["client_id", "client_secret", "id_token", "idp_token_endpoint", "idp_client_id"],
};

/**
 * Check a toolset's `oauth` entry: one grant, and only its keys.
 * @throws {ConfigError} naming `at.key`
 */
export function checkOAuth(o: ToolsetOAuth, at: string): void {
  const given = Object.keys(o).filter((k) => o[k as keyof typeof o] !== undefined);
  if (o.token !== undefined) {
    const other = given.filter((k) => k !== "token");
    if (other.length) {
      throw new ConfigError(
        `${at}: give a token or client credentials, not both (remove ${
          other.map((k) => `"${k}"`).join(", ")
        })`,
      );
    }
    return;
  }
  if (o.grant !== undefined && !GRANTS.includes(o.grant)) {
    throw new ConfigError(
      `${at}.grant: "${o.grant}" is not a grant vf makes; expected ${
        GRANTS.map((g) => `"${g}"`).join(", ")
      }`,
    );
  }
  if (o.grant === undefined && o.client_id === undefined) {
    throw new ConfigError(
      `${at}: give token (a bearer token), client_id with client_secret or private_key (client ` +
        `credentials), or grant = "authorization_code" or "cross_app"`,
    );
  }
  const grant = o.grant ?? "client_credentials";
  const allowed = ["grant", "scope", "issuer", ...GRANT_KEYS[grant]];
  const stray = given.find((k) => !allowed.includes(k));
  if (stray) {
    throw new ConfigError(
      `${at}.${stray}: not a key of the ${grant} grant, which takes ${
        allowed.map((k) => `"${k}"`).join(", ")
      }`,
    );
  }
  if (grant === "client_credentials") {
    if (o.client_id === undefined) throw new ConfigError(`${at}.client_id: required`);
    if ((o.client_secret === undefined) === (o.private_key === undefined)) {
      throw new ConfigError(`${at}: give client_secret or private_key with client_id`);
    }
  }
  if (grant === "authorization_code") {
    if (o.client_secret !== undefined && o.client_id === undefined) {
      throw new ConfigError(`${at}.client_secret: give the client_id it belongs to`);
    }
    if (o.redirect_uri !== undefined && !o.redirect_uri.includes("${")) {
      const problem = checkRedirectUri(o.redirect_uri);
      if (problem) throw new ConfigError(`${at}.redirect_uri: ${problem}`);
    }
    if (
      o.client_metadata_url !== undefined && !o.client_metadata_url.includes("${") &&
      !/^https:\/\/[^/]+\/./.test(o.client_metadata_url)
    ) {
      throw new ConfigError(
        `${at}.client_metadata_url: "${o.client_metadata_url}" is not an https URL with a path`,
      );
    }
    const t = o.authorize_timeout;
    if (t !== undefined && !(typeof t === "number" && t > 0)) {
      throw new ConfigError(`${at}.authorize_timeout: expected seconds (a positive number)`);
    }
  }
  if (grant === "cross_app") {
    for (const k of ["client_id", "client_secret", "id_token", "idp_token_endpoint"] as const) {
      if (o[k] === undefined) throw new ConfigError(`${at}.${k}: required by the cross_app grant`);
    }
  }
}

function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

function challengeOf(verifier: string): string {
  return createHash("sha256").update(verifier).digest("base64url");
}

/** The authorization-code grant's client side (the SDK's provider interface). */
export class AuthCodeProvider {
  readonly #options: AuthCodeOptions;
  readonly #redirect: URL;
  #client: OAuthClientInformationMixed | undefined;
  #tokens: OAuthTokens | undefined;
  #discovery: OAuthDiscoveryState | undefined;
  /** Verifiers of authorizations started and not finished (matched by their challenge). */
  #verifiers: string[] = [];
  #verifier = "";
  /** An authorization in progress, which a concurrent one waits for instead of asking again. */
  #pending: Promise<void> | undefined;
  /** Held while a toolset connects, so that concurrent rollouts authorize once. */
  #lock: Promise<void> = Promise.resolve();
  /** Counts the tokens saved: a request that saw it change may be sent again. */
  generation = 0;
  /** How many authorizations were completed (one per grant, refreshes excluded). */
  authorizations = 0;
  authorizeTimeout = AUTHORIZE_TIMEOUT;
  notify: (message: string) => void = (message) => console.error(message);

  constructor(options: AuthCodeOptions) {
    this.#options = options;
    this.#redirect = new URL(options.redirectUri ?? `http://127.0.0.1:${freePort()}/callback`);
    if (options.clientId !== undefined) {
      this.#client = {
        client_id: options.clientId,
        ...(options.clientSecret !== undefined ? { client_secret: options.clientSecret } : {}),
      };
    }
  }

  /** Wait for the toolsets connecting before; the result releases the next. */
  async acquire(): Promise<() => void> {
    const before = this.#lock;
    const { promise, resolve } = Promise.withResolvers<void>();
    this.#lock = promise;
    await before;
    return resolve;
  }

  get redirectUrl(): string {
    return this.#redirect.href;
  }

  get clientMetadataUrl(): string | undefined {
    return this.#options.clientMetadataUrl;
  }

  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: "vf",
      redirect_uris: [this.#redirect.href],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: this.#options.clientSecret !== undefined
        ? "client_secret_basic"
        : "none",
      ...(this.#options.scope ? { scope: this.#options.scope } : {}),
    };
  }

  state(): string {
    return randomBytes(16).toString("base64url");
  }

  clientInformation(): OAuthClientInformationMixed | undefined {
    return this.#client;
  }

  saveClientInformation(info: OAuthClientInformationMixed): void {
    // A pre-registered client is bound to a server, never replaced by a registration.
    if (this.#options.clientId !== undefined && info.client_id !== this.#options.clientId) {
      throw new Error(
        `Toolset "${this.#options.toolset}" oauth.client_id: the authorization server does not ` +
          `know client "${this.#options.clientId}"`,
      );
    }
    this.#client = info;
  }

  tokens(): OAuthTokens | undefined {
    return this.#tokens;
  }

  saveTokens(tokens: OAuthTokens): void {
    this.#tokens = tokens;
    this.generation++;
  }

  saveCodeVerifier(verifier: string): void {
    this.#verifiers.push(verifier);
  }

  codeVerifier(): string {
    return this.#verifier;
  }

  discoveryState(): OAuthDiscoveryState | undefined {
    return this.#discovery;
  }

  saveDiscoveryState(state: OAuthDiscoveryState): void {
    this.#discovery = state;
  }

  invalidateCredentials(scope: "all" | "client" | "tokens" | "verifier" | "discovery"): void {
    if (scope === "all" || scope === "tokens") this.#tokens = undefined;
    if ((scope === "all" || scope === "client") && this.#options.clientId === undefined) {
      this.#client = undefined;
    }
    if (scope === "all" || scope === "discovery") this.#discovery = undefined;
    if (scope === "all" || scope === "verifier") this.#verifiers = [];
  }

  /**
   * Complete the authorization the SDK asks for: get a code (headlessly, or from a person) and
   * exchange it. The request that needed it is then sent again with the new token.
   */
  async redirectToAuthorization(url: URL): Promise<void> {
    if (this.#pending) {
      // Another request is being authorized; its token serves this one too.
      await this.#pending.catch(() => {});
      return;
    }
    this.#pending = this.#authorize(url);
    try {
      await this.#pending;
    } finally {
      this.#pending = undefined;
    }
  }

  async #authorize(url: URL): Promise<void> {
    const challenge = url.searchParams.get("code_challenge");
    const verifier = this.#verifiers.find((v) => challengeOf(v) === challenge);
    this.#verifiers = this.#verifiers.filter((v) => v !== verifier);
    if (!verifier) throw new Error("The authorization request has no code verifier of vf's");
    // A refresh token is worth asking for: a long run outlives an access token.
    const offered = this.#discovery?.authorizationServerMetadata?.scopes_supported ?? [];
    const scope = url.searchParams.get("scope")?.split(" ").filter(Boolean) ?? [];
    if (offered.includes("offline_access") && !scope.includes("offline_access")) {
      url.searchParams.set("scope", [...scope, "offline_access"].join(" "));
    }
    const code = await this.#code(url);
    this.#verifier = verifier;
    const { auth } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/client/auth.js");
    const result = await auth(this, {
      serverUrl: this.#options.serverUrl,
      authorizationCode: code,
      ...(this.#discovery?.resourceMetadataUrl
        ? { resourceMetadataUrl: new URL(this.#discovery.resourceMetadataUrl) }
        : {}),
    });
    if (result !== "AUTHORIZED") throw new Error("The authorization code was not exchanged");
    this.authorizations++;
  }

  /** The code for `url`: from the server's redirect if it gives one, else from a person. */
  async #code(url: URL): Promise<string> {
    const state = url.searchParams.get("state") ?? "";
    const timeout = this.authorizeTimeout * 1000;
    let at = url;
    for (let hop = 0; hop < 5; hop++) {
      const res = await fetch(at, { redirect: "manual", signal: AbortSignal.timeout(timeout) });
      await res.body?.cancel();
      const location = res.headers.get("location");
      if (res.status >= 300 && res.status < 400 && location) {
        const next = new URL(location, at);
        if (next.origin + next.pathname === this.#redirect.origin + this.#redirect.pathname) {
          return this.#fromRedirect(next, state);
        }
        // A redirect elsewhere is a login page on the way: a person's to follow.
        if (next.origin !== url.origin) break;
        at = next;
        continue;
      }
      if (res.status >= 400 && res.status !== 401 && res.status !== 403) {
        throw new Error(
          `The authorization endpoint ${url.origin}${url.pathname} answered ${res.status}`,
        );
      }
      break;
    }
    return await this.#fromPerson(url, state);
  }

  #fromRedirect(redirect: URL, state: string): string {
    const error = redirect.searchParams.get("error");
    if (error) {
      const description = redirect.searchParams.get("error_description");
      throw new Error(
        `The authorization server refused: ${error}${description ? ` (${description})` : ""}`,
      );
    }
    if ((redirect.searchParams.get("state") ?? "") !== state) {
      throw new Error("The authorization server's redirect carries another state than vf sent");
    }
    const code = redirect.searchParams.get("code");
    if (!code) throw new Error("The authorization server's redirect carries no code");
    return code;
  }

  /** Print the URL and wait on the loopback redirect URI for the person's redirect. */
  async #fromPerson(url: URL, state: string): Promise<string> {
    const seconds = this.authorizeTimeout;
    const stop = new AbortController();
    const { promise, resolve, reject } = Promise.withResolvers<string>();
    let server: Deno.HttpServer;
    try {
      server = Deno.serve({
        hostname: this.#redirect.hostname.replace(/^\[|\]$/g, ""),
        port: Number(this.#redirect.port),
        signal: stop.signal,
        onListen: () => {},
      }, (req) => {
        const got = new URL(req.url);
        if (got.pathname !== this.#redirect.pathname) {
          return new Response("Not found", { status: 404 });
        }
        try {
          resolve(this.#fromRedirect(got, state));
          return new Response("vf is authorized; you can close this page.\n");
        } catch (error) {
          reject(error);
          return new Response(`vf was not authorized: ${(error as Error).message}\n`, {
            status: 400,
          });
        }
      });
    } catch (error) {
      throw new Error(
        `Cannot listen on the redirect URI ${this.#redirect.href}: ${(error as Error).message}; ` +
          `set oauth.redirect_uri to a free loopback port`,
      );
    }
    this.notify(
      `Toolset "${this.#options.toolset}" needs an authorization: open this URL in a browser ` +
        `within ${seconds} s\n  ${url.href}`,
    );
    const timer = setTimeout(() =>
      reject(
        new Error(
          `Nobody completed the authorization within ${seconds} s (oauth.authorize_timeout); ` +
            `the URL was printed on stderr`,
        ),
      ), seconds * 1000);
    try {
      return await promise;
    } finally {
      clearTimeout(timer);
      stop.abort();
      await server.finished;
    }
  }
}

/** What cross-app access needs (template values already resolved). */
export interface CrossAppOptions {
  toolset: string;
  /** The client registered at the MCP server's authorization server. */
  clientId: string;
  clientSecret: string;
  /** The user's ID token from the identity provider. */
  idToken: string;
  /** The identity provider's token endpoint, where the ID token is exchanged. */
  idpTokenEndpoint: string;
  /** The client at the identity provider, when it wants one named. */
  idpClientId?: string;
  scope?: string;
}

/**
 * Cross-app access: no redirect. The token request exchanges the ID token at the identity
 * provider for an identity assertion grant naming the authorization server and the MCP
 * server's resource, then presents it as a JWT bearer grant.
 */
export class CrossAppProvider {
  readonly #options: CrossAppOptions;
  #tokens: OAuthTokens | undefined;
  #discovery: OAuthDiscoveryState | undefined;
  #client: OAuthClientInformationMixed;

  constructor(options: CrossAppOptions) {
    this.#options = options;
    this.#client = { client_id: options.clientId, client_secret: options.clientSecret };
  }

  get redirectUrl(): undefined {
    return undefined;
  }

  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: "vf",
      redirect_uris: [],
      grant_types: ["urn:ietf:params:oauth:grant-type:jwt-bearer"],
      token_endpoint_auth_method: "client_secret_basic",
      ...(this.#options.scope ? { scope: this.#options.scope } : {}),
    };
  }

  clientInformation(): OAuthClientInformationMixed {
    return this.#client;
  }

  saveClientInformation(info: OAuthClientInformationMixed): void {
    this.#client = info;
  }

  tokens(): OAuthTokens | undefined {
    return this.#tokens;
  }

  saveTokens(tokens: OAuthTokens): void {
    this.#tokens = tokens;
  }

  discoveryState(): OAuthDiscoveryState | undefined {
    return this.#discovery;
  }

  saveDiscoveryState(state: OAuthDiscoveryState): void {
    this.#discovery = state;
  }

  redirectToAuthorization(): void {
    throw new Error("Cross-app access needs no browser; the identity provider refused");
  }

  saveCodeVerifier(): void {}

  codeVerifier(): string {
    return "";
  }

  async prepareTokenRequest(scope?: string): Promise<URLSearchParams> {
    const discovery = this.#discovery;
    const audience = discovery?.authorizationServerMetadata?.issuer ??
      discovery?.authorizationServerUrl;
    const resource = discovery?.resourceMetadata?.resource;
    if (!audience || !resource) {
      throw new Error(
        `Toolset "${this.#options.toolset}": cross-app access needs the server's protected ` +
          `resource metadata and its authorization server's metadata`,
      );
    }
    const body = new URLSearchParams({
      grant_type: "urn:ietf:params:oauth:grant-type:token-exchange",
      requested_token_type: "urn:ietf:params:oauth:token-type:id-jag",
      subject_token: this.#options.idToken,
      subject_token_type: "urn:ietf:params:oauth:token-type:id_token",
      audience: String(audience),
      resource: String(resource),
      ...(this.#options.idpClientId ? { client_id: this.#options.idpClientId } : {}),
      ...(scope ? { scope } : {}),
    });
    const res = await fetch(this.#options.idpTokenEndpoint, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
      body,
    });
    const text = await res.text();
    let grant: { access_token?: string; issued_token_type?: string } = {};
    try {
      grant = JSON.parse(text);
    } catch { /* reported below */ }
    if (!res.ok || !grant.access_token) {
      throw new Error(
        `The identity provider ${this.#options.idpTokenEndpoint} (oauth.idp_token_endpoint) ` +
          `did not exchange the ID token: ${res.status} ${text.slice(0, 300)}`,
      );
    }
    const params = new URLSearchParams({
      grant_type: "urn:ietf:params:oauth:grant-type:jwt-bearer",
      assertion: grant.access_token,
    });
    if (scope) params.set("scope", scope);
    return params;
  }
}

/**
 * A streamable-HTTP transport whose requests are sent again once the provider has completed
 * an authorization for them (the SDK's transport reports the redirect as unauthorized), up to
 * three times a request: a server that keeps asking for a scope it never grants fails.
 */
export async function authCodeTransport(
  url: URL,
  options: { requestInit?: RequestInit; authProvider: AuthCodeProvider; fetch?: typeof fetch },
): Promise<HttpTransport> {
  const { StreamableHTTPClientTransport: Base } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/client/streamableHttp.js"
  );
  const { UnauthorizedError } = await import(
    "npm:@modelcontextprotocol/sdk@^1.32.0/client/auth.js"
  );
  const provider = options.authProvider;
  const transport = new Base(url, options);
  const send = transport.send.bind(transport);
  // The SDK sends the retry after an authorization through `this.send`, so through this too.
  transport.send = async (...args: Parameters<HttpTransport["send"]>) => {
    for (let attempt = 0;; attempt++) {
      const before = provider.generation;
      try {
        return await send(...args);
      } catch (error) {
        if (
          !(error instanceof UnauthorizedError) || provider.generation === before || attempt >= 2
        ) throw error;
      }
    }
  };
  return transport;
}
