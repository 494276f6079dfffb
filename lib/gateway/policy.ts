/**
 * Network policy: which hosts a sandbox may reach through the rollout's egress proxy.
 * Rules are host globs (`*.example.org`), hosts with a port (`pypi.org:443`), IPs, or URL
 * origins (`https://api.x.com`, whose scheme gives the default port); paths are ignored.
 * An empty `allow`, or `"*"` in `block`, leaves only what vf itself provides (the model
 * gateway and the rollout's services).
 * @module
 */
import { ConfigError } from "../errors.ts";

/** Where a sandbox may connect: allowed rules, minus blocked ones. */
export interface NetworkPolicy {
  allow: string[];
  block: string[];
}

/** A policy as configs write it: `allow` defaults to `["*"]`, `block` to `[]`. */
export interface NetworkPolicyInput {
  allow?: string[];
  block?: string[];
}

/** Everything allowed (the setup phase's default). */
export const OPEN_POLICY: NetworkPolicy = { allow: ["*"], block: [] };
/** Nothing but what vf provides. */
export const CLOSED_POLICY: NetworkPolicy = { allow: [], block: ["*"] };

interface Rule {
  host: string;
  port: number | null;
}

const HOST =
  /^(\*|(\*\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?)$/i;
const IPV6 = /^\[[0-9a-f:.]+\]$/i;

function parseRule(entry: string): Rule | null {
  let text = entry.trim();
  if (text === "*") return { host: "*", port: null };
  let defaultPort: number | null = null;
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(text);
  if (scheme) {
    const s = scheme[1].toLowerCase();
    defaultPort = s === "https" ? 443 : s === "http" ? 80 : null;
    text = text.slice(scheme[0].length).replace(/[/?#].*$/, "");
  }
  const m = /^(.*?)(?::(\d{1,5}))?$/.exec(text);
  if (!m) return null;
  const host = m[1].toLowerCase();
  const port = m[2] !== undefined ? Number(m[2]) : defaultPort;
  if (port !== null && (port < 1 || port > 65535)) return null;
  if (!HOST.test(host) && !IPV6.test(host)) return null;
  // Numeric spellings of an address (`0xac110001`, `::ffff:…`) match the form requests get.
  const bare = host.replace(/\.$/, "").replace(/^\[|\]$/g, "");
  return { host: bare.includes("*") ? bare : canonicalHost(bare).replace(/\.$/, ""), port };
}

/**
 * Read a policy from config (`network = { allow = [...], block = [...] }`).
 * @throws {ConfigError} naming `where` and the entry that is not a host
 */
export function parseNetworkPolicy(raw: unknown, where: string): NetworkPolicy {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new ConfigError(`${where} must be true, false or { allow = [...], block = [...] }`);
  }
  const obj = raw as Record<string, unknown>;
  for (const key of Object.keys(obj)) {
    if (key !== "allow" && key !== "block") {
      throw new ConfigError(`${where}.${key} is not a network policy key (allow, block)`);
    }
  }
  const list = (key: "allow" | "block", fallback: string[]): string[] => {
    const value = obj[key] ?? fallback;
    if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) {
      throw new ConfigError(`${where}.${key} must be a list of hosts`);
    }
    for (const entry of value as string[]) {
      if (!parseRule(entry)) {
        throw new ConfigError(
          `${where}.${key}: "${entry}" is not a host, host:port, *.domain or URL origin`,
        );
      }
    }
    return value as string[];
  };
  return normalizePolicy({ allow: list("allow", ["*"]), block: list("block", []) }, where);
}

/**
 * The canonical form: framework-only access is `{allow: [], block: ["*"]}`.
 * @throws {ConfigError} for a concrete allow list combined with blocks
 */
export function normalizePolicy(policy: NetworkPolicy, where = "network"): NetworkPolicy {
  if (policy.allow.length === 0 || policy.block.includes("*")) {
    return structuredClone(CLOSED_POLICY);
  }
  if (!policy.allow.includes("*") && policy.block.length > 0) {
    throw new ConfigError(
      `${where}: a concrete allow list cannot be combined with block rules; list only what to allow`,
    );
  }
  return { allow: [...policy.allow], block: [...policy.block] };
}

/**
 * A task's policy over its runtime's: a task allow of `*` keeps the runtime's list, two
 * concrete lists intersect, and blocks add up.
 */
export function composePolicies(runtime: NetworkPolicy, task: NetworkPolicy): NetworkPolicy {
  const allow = task.allow.includes("*")
    ? runtime.allow
    : runtime.allow.includes("*")
    ? task.allow
    : task.allow.filter((a) => runtime.allow.includes(a));
  const block = [...new Set([...runtime.block, ...task.block])];
  if (allow.length === 0 || block.includes("*")) return structuredClone(CLOSED_POLICY);
  // Blocks stay with a concrete allow list too: they are checked first.
  return { allow: [...allow], block };
}

function matches(rule: Rule, host: string, port: number): boolean {
  if (rule.port !== null && rule.port !== port) return false;
  if (rule.host === "*") return true;
  if (rule.host.startsWith("*.")) return host.endsWith(rule.host.slice(1));
  return host === rule.host;
}

/** Whether `policy` lets a sandbox connect to `host:port`. */
export function policyAllows(policy: NetworkPolicy, host: string, port: number): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "").replace(/\.$/, "");
  const rules = (list: string[]) => list.map(parseRule).filter((r): r is Rule => r !== null);
  if (rules(policy.block).some((r) => matches(r, h, port))) return false;
  return rules(policy.allow).some((r) => matches(r, h, port));
}

/**
 * Whether an allow rule names `host` itself (not through `*` or a `*.domain` glob) for
 * `port`: `172.17.0.1:8000` names that one port of the host, `172.17.0.1` every port.
 */
export function namedByAllow(policy: NetworkPolicy, host: string, port: number): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, "").replace(/\.+$/, "");
  return policy.allow.map(parseRule).some((r) =>
    r !== null && r.host === h && (r.port === null || r.port === port)
  );
}

/**
 * A host as the network sees it: numeric IPv4 spellings (`2130706433`, `0x7f000001`,
 * `127.1`) and IPv4-mapped IPv6 become dotted IPv4, names are lower-cased.
 */
export function canonicalHost(raw: string): string {
  const bare = raw.replace(/^\[|\]$/g, "");
  let host = bare.toLowerCase();
  try {
    host = new URL(`http://${bare.includes(":") ? `[${bare}]` : bare}`).hostname
      .replace(/^\[|\]$/g, "");
  } catch { /* not a host the URL parser takes: kept, and refused by the rules */ }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(host);
  if (mapped) {
    const hi = parseInt(mapped[1], 16);
    const lo = parseInt(mapped[2], 16);
    host = [hi >> 8, hi & 255, lo >> 8, lo & 255].join(".");
  }
  return host;
}
