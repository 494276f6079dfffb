/**
 * The environment of a child `deno` process in tests: only what Deno needs to run and to reach
 * the npm registry (TLS trust, proxies), so nothing else from the machine leaks in.
 * @module
 */

const PASS_THROUGH = [
  "PATH",
  "HOME",
  "TMPDIR",
  "DENO_DIR",
  "XDG_CACHE_HOME",
  "NPM_CONFIG_REGISTRY",
  "NODE_EXTRA_CA_CERTS", // how Deno trusts an intercepting proxy's CA
  "DENO_CERT",
  "DENO_TLS_CA_STORE",
  "SSL_CERT_FILE",
  "SSL_CERT_DIR",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "http_proxy",
  "https_proxy",
];

/** A clean child environment plus `extra` (which wins); loopback never goes through a proxy. */
export function childEnv(extra: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = { NO_COLOR: "1" };
  for (const name of PASS_THROUGH) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  const noProxy = Deno.env.get("NO_PROXY") ?? Deno.env.get("no_proxy");
  env.NO_PROXY = noProxy ? `${noProxy},127.0.0.1` : "127.0.0.1";
  return { ...env, ...extra };
}
