/**
 * The environment of a child `deno` process in tests: only what Deno needs to run and to reach
 * the npm registry (TLS trust, proxies), so nothing else from the machine leaks in.
 * @module
 */

/** What a child needs to run Deno from its cache. */
const BARE = ["PATH", "HOME", "TMPDIR", "DENO_DIR", "XDG_CACHE_HOME"];

/** What it needs on top of that to reach the npm registry. */
const REGISTRY = [
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

/** What a child keeps from this process's environment. */
export interface ChildEnvOptions {
  /**
   * Keep what reaching the npm registry needs (TLS trust, proxies; loopback then never goes
   * through a proxy). With `false` the child keeps only PATH, HOME, TMPDIR, DENO_DIR and
   * XDG_CACHE_HOME: enough to run from the cache. Default `true`.
   */
  registry?: boolean;
  /** Keep DOCKER_HOST, so the child reaches the same Docker engine. Default `false`. */
  docker?: boolean;
}

/** A clean child environment plus `extra` (which wins); `NO_COLOR` is always set. */
export function childEnv(
  extra: Record<string, string> = {},
  options: ChildEnvOptions = {},
): Record<string, string> {
  const { registry = true, docker = false } = options;
  const env: Record<string, string> = { NO_COLOR: "1" };
  const names = [...BARE, ...(registry ? REGISTRY : []), ...(docker ? ["DOCKER_HOST"] : [])];
  for (const name of names) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  if (registry) {
    const noProxy = Deno.env.get("NO_PROXY") ?? Deno.env.get("no_proxy");
    env.NO_PROXY = noProxy ? `${noProxy},127.0.0.1` : "127.0.0.1";
  }
  return { ...env, ...extra };
}
