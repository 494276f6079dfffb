/**
 * The part of OpenSSH's client configuration (`~/.ssh/config`) the ssh runtime honours, so a
 * host alias that works with `ssh my-gpu-box` works as `host = "my-gpu-box"`: `HostName`,
 * `User`, `Port`, `IdentityFile`, `UserKnownHostsFile`, and `ProxyJump`/`ProxyCommand`
 * (reported, since the runtime connects directly). Rules as in ssh_config(5): `Host` blocks
 * apply in file order when one of their patterns matches and none of their `!` patterns does;
 * the first value found for a keyword wins, except `IdentityFile`, which accumulates.
 * `Match` blocks and `Include` are skipped.
 * @module
 */

/** What the configuration says about one host alias. */
export interface SshHostConfig {
  hostName?: string;
  user?: string;
  port?: number;
  identityFiles: string[];
  knownHostsFile?: string;
  /** `ProxyJump` or `ProxyCommand`, with its value, when one applies. */
  proxy?: string;
  /** The `Host` line (1-based) of each block that applied, for messages. */
  lines: number[];
}

/** Values the `%` tokens and `~` expand to. */
export interface SshConfigContext {
  home: string;
  localUser: string;
}

interface Entry {
  keyword: string;
  value: string;
  line: number;
}

/** One `Host` pattern list against a name (`*` and `?` wildcards, `!` negation). */
export function hostMatches(patterns: string[], name: string): boolean {
  let matched = false;
  for (const raw of patterns) {
    const negated = raw.startsWith("!");
    const pattern = (negated ? raw.slice(1) : raw).toLowerCase();
    const re = new RegExp(
      "^" + pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") +
        "$",
    );
    if (re.test(name.toLowerCase())) {
      if (negated) return false;
      matched = true;
    }
  }
  return matched;
}

function splitArgs(text: string): string[] {
  const out: string[] = [];
  const re = /"([^"]*)"|(\S+)/g;
  for (const m of text.matchAll(re)) out.push(m[1] ?? m[2]);
  return out;
}

function parse(text: string): Entry[] {
  const entries: Entry[] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith("#")) return;
    const m = /^(\S+?)(?:\s*=\s*|\s+)(.*)$/.exec(line);
    if (!m) return;
    entries.push({ keyword: m[1].toLowerCase(), value: m[2].trim(), line: i + 1 });
  });
  return entries;
}

/** `~`, `%d` (home), `%u` (local user), `%h` (host), `%r` (remote user), `%%`. */
function expand(value: string, ctx: SshConfigContext, host: string, user: string): string {
  const tilde = value.startsWith("~/") ? ctx.home + value.slice(1) : value;
  return tilde.replace(
    /%([%dhur])/g,
    (_, t: string) =>
      t === "%" ? "%" : t === "d" ? ctx.home : t === "u" ? ctx.localUser : t === "h" ? host : user,
  );
}

/**
 * Resolves `alias` against a configuration file's text.
 * @param text the file's contents
 * @param alias the name given as the runtime's host
 * @param ctx home directory and local user, for `~` and `%` tokens
 */
export function resolveSshHost(
  text: string,
  alias: string,
  ctx: SshConfigContext,
): SshHostConfig {
  const found: Record<string, string> = {};
  const identities: string[] = [];
  const lines: number[] = [];
  let applies = true; // before the first Host line, entries apply to every host
  for (const e of parse(text)) {
    if (e.keyword === "host") {
      applies = hostMatches(splitArgs(e.value), alias);
      if (applies) lines.push(e.line);
      continue;
    }
    if (e.keyword === "match") {
      applies = false; // conditions vf cannot evaluate; skip the block
      continue;
    }
    if (!applies) continue;
    const value = splitArgs(e.value)[0] ?? "";
    if (e.keyword === "identityfile") identities.push(value);
    else if (!(e.keyword in found)) {
      found[e.keyword] = e.keyword === "proxycommand" ? e.value : value;
    }
  }
  const hostName = found.hostname?.replace(/%h/g, alias);
  const user = found.user;
  const out: SshHostConfig = { identityFiles: [], lines };
  if (hostName) out.hostName = hostName;
  if (user) out.user = user;
  if (found.port !== undefined) {
    const port = Number(found.port);
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new RangeError(`Port "${found.port}" for host "${alias}" is not a port number`);
    }
    out.port = port;
  }
  const host = hostName ?? alias;
  const remoteUser = user ?? ctx.localUser;
  out.identityFiles = identities.filter((f) => f.toLowerCase() !== "none").map((f) =>
    expand(f, ctx, host, remoteUser)
  );
  const knownHosts = found.userknownhostsfile;
  if (knownHosts && knownHosts.toLowerCase() !== "none") {
    out.knownHostsFile = expand(knownHosts, ctx, host, remoteUser);
  }
  for (const keyword of ["proxyjump", "proxycommand"]) {
    const value = found[keyword];
    if (value && value.toLowerCase() !== "none") {
      out.proxy = `${keyword === "proxyjump" ? "ProxyJump" : "ProxyCommand"} ${value}`;
      break;
    }
  }
  return out;
}
