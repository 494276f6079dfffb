/**
 * The variables a child Deno (or Node) process needs to fetch its modules and packages as
 * the evaluator does: the CA bundles of a TLS-inspecting network, the npm registry and the
 * proxies. A child started with a stripped environment (a stdio toolset, the permission
 * sandbox's host) gets these and nothing else that could hold a key.
 * @module
 */
import process from "node:process";

const FETCH_ENV =
  /^(SSL_CERT_FILE|SSL_CERT_DIR|NODE_EXTRA_CA_CERTS|DENO_CERT|DENO_TLS_CA_STORE|NPM_CONFIG_REGISTRY|HTTPS?_PROXY|NO_PROXY|https?_proxy|no_proxy)$/;

/**
 * The fetch-related variables set in this process's environment. With `credentials: false` a
 * proxy URL loses its `user:password@` (for a child that can read its environment).
 */
export function fetchEnv(options: { credentials?: boolean } = {}): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!v || !FETCH_ENV.test(k)) continue;
    out[k] = options.credentials === false && /proxy$/i.test(k) ? withoutUserinfo(v) : v;
  }
  return out;
}

function withoutUserinfo(value: string): string {
  try {
    const url = new URL(value);
    if (!url.username && !url.password) return value;
    url.username = "";
    url.password = "";
    return url.toString();
  } catch {
    return value; // not a URL (NO_PROXY's host list, a bare host:port): nothing to strip
  }
}
