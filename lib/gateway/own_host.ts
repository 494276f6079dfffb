/**
 * The evaluator's own host as the egress proxy must see it, so that a sandbox whose policy
 * allows `*` still cannot reach what the evaluator serves (a local model server, the env
 * server, the gateway itself) nor other rollouts' containers: every address on the host's
 * interfaces, every local Docker network's gateway and subnet, loopback, link-local, cloud
 * metadata and unspecified addresses, in whatever spelling an address comes (IPv4-mapped and
 * other IPv6 forms that carry an IPv4 address, zone ids), and the names that mean the host
 * whatever they resolve to.
 * @module
 */
import { hostname, networkInterfaces } from "node:os";
import net from "node:net";

/** The eight 16-bit groups of an IPv6 address (a zone id is dropped), or null. */
function ipv6Groups(text: string): number[] | null {
  let s = text.replace(/^\[|\]$/g, "").replace(/%.*$/, "").toLowerCase();
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (tail) {
    if (net.isIPv4(tail[1]) === false) return null;
    const [a, b, c, d] = tail[1].split(".").map(Number);
    s = s.slice(0, -tail[1].length) +
      `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const halves = s.split("::");
  if (halves.length > 2) return null;
  const part = (h: string) => (h === "" ? [] : h.split(":"));
  const head = part(halves[0]);
  const rest = halves.length === 2 ? part(halves[1]) : [];
  const fill = halves.length === 2 ? 8 - head.length - rest.length : 0;
  if (fill < 0 || (halves.length === 1 && head.length !== 8)) return null;
  const groups = [...head, ...Array(fill).fill("0"), ...rest];
  if (groups.length !== 8 || groups.some((g) => !/^[0-9a-f]{1,4}$/.test(g))) return null;
  return groups.map((g) => parseInt(g, 16));
}

function dotted(hi: number, lo: number): string {
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join(".");
}

/**
 * Every form an IP address has for the purpose of "where does a connection to it land":
 * dotted IPv4 as is; an IPv6 address in one canonical spelling (full groups, no zone), plus
 * the IPv4 address it carries when it is IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible,
 * IPv4-translated, NAT64 (`64:ff9b::/96`, `64:ff9b:1::/48`) or 6to4 (`2002::/16`).
 * Empty for what is not an IP address.
 */
export function addressForms(ip: string): string[] {
  const bare = ip.replace(/^\[|\]$/g, "").replace(/%.*$/, "");
  if (net.isIPv4(bare)) return [bare];
  const g = ipv6Groups(bare);
  if (!g) return [];
  const forms = [g.map((x) => x.toString(16).padStart(4, "0")).join(":")];
  const zero = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  const v4 = dotted(g[6], g[7]);
  if (zero(0, 5) && g[5] === 0xffff) forms.push(v4); // mapped
  else if (zero(0, 6) && (g[6] !== 0 || g[7] > 1)) forms.push(v4); // compatible
  else if (zero(0, 4) && g[4] === 0xffff && g[5] === 0) forms.push(v4); // translated
  else if (g[0] === 0x64 && g[1] === 0xff9b && (zero(2, 6) || g[2] === 1)) forms.push(v4);
  else if (g[0] === 0x2002) forms.push(dotted(g[1], g[2])); // 6to4
  return forms;
}

/** Cloud metadata services outside link-local: Alibaba's, and AWS's over IPv6. */
const METADATA = new Set(["100.100.100.200", "fd00:0ec2:0000:0000:0000:0000:0000:0254"]);

/**
 * Loopback, link-local and other cloud metadata, unspecified, broadcast and multicast
 * addresses, in any spelling: never reached through a wildcard.
 */
export function isReservedAddress(ip: string): boolean {
  return addressForms(ip).some((form) => {
    if (METADATA.has(form)) return true;
    const v4 = /^(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(form);
    if (v4) {
      const [a, b] = [Number(v4[1]), Number(v4[2])];
      return a === 127 || a === 0 || (a === 169 && b === 254) || a >= 224;
    }
    return form === "0000:0000:0000:0000:0000:0000:0000:0000" ||
      form === "0000:0000:0000:0000:0000:0000:0000:0001" ||
      /^fe[89a-f]/.test(form) || // link-local, and the old site-local
      /^ff/.test(form); // multicast
  });
}

/** Names that mean the evaluator's host whatever they resolve to (or fail to). */
export function isHostAlias(name: string): boolean {
  const h = name.toLowerCase().replace(/\.+$/, "");
  let own = "";
  try {
    own = hostname().toLowerCase();
  } catch { /* no hostname to compare with */ }
  return h === "localhost" || h.endsWith(".localhost") ||
    h === "host.docker.internal" || h === "gateway.docker.internal" ||
    h === "host.containers.internal" || h === "host.lima.internal" ||
    (own !== "" && h === own);
}

/** An address as a number and its width (32 or 128 bits), from one of its forms. */
function bits(form: string): { value: bigint; width: number } | null {
  if (net.isIPv4(form)) {
    return {
      value: form.split(".").reduce((n, octet) => (n << 8n) | BigInt(octet), 0n),
      width: 32,
    };
  }
  const g = ipv6Groups(form);
  return g ? { value: g.reduce((n, x) => (n << 16n) | BigInt(x), 0n), width: 128 } : null;
}

/** A subnet (`a.b.c.d/n`, `x::/n`) as its network number, width and prefix, or null. */
function subnet(cidr: string): { value: bigint; width: number; prefix: number } | null {
  const m = /^(.+)\/(\d{1,3})$/.exec(cidr.trim());
  if (!m) return null;
  const base = bits(m[1]);
  const prefix = Number(m[2]);
  if (!base || prefix > base.width) return null;
  return { value: base.value >> BigInt(base.width - prefix), width: base.width, prefix };
}

/** Whether any form of `ip` lies in one of `subnets`. */
function inSubnets(
  ip: string,
  subnets: Array<{ value: bigint; width: number; prefix: number }>,
): boolean {
  return addressForms(ip).some((form) => {
    const a = bits(form);
    return a !== null &&
      subnets.some((s) => s.width === a.width && a.value >> BigInt(a.width - s.prefix) === s.value);
  });
}

/**
 * The set of the host's own addresses: the interfaces' (read afresh each time, so a network
 * created a moment ago counts at once) plus what `extra` reports (Docker networks' gateways,
 * and their subnets as `a.b.c.d/n`, where other rollouts' containers live), kept for `ttlMs`.
 */
export class OwnAddresses {
  readonly #extra: (() => Promise<Iterable<string>>) | undefined;
  readonly #ttlMs: number;
  readonly #fixed = new Set<string>();
  #cached: { at: number; known: Promise<Known> } | null = null;

  constructor(options: { extra?: () => Promise<Iterable<string>>; ttlMs?: number } = {}) {
    this.#extra = options.extra;
    this.#ttlMs = options.ttlMs ?? 2_000;
  }

  /** Count `ip` as the host's own from now on (an address the gateway listens on). */
  add(ip: string): void {
    for (const form of addressForms(ip)) this.#fixed.add(form);
  }

  /**
   * Whether a connection to `ip` would land on this host, or on a container of one of its
   * Docker networks.
   * @throws {Error} when the host's interfaces cannot be listed (the caller refuses then)
   */
  async has(ip: string): Promise<boolean> {
    const own = new Set(this.#fixed);
    for (const list of Object.values(networkInterfaces())) {
      for (const a of list ?? []) for (const form of addressForms(a.address)) own.add(form);
    }
    const extra = await this.#extraKnown();
    return addressForms(ip).some((form) => own.has(form) || extra.forms.has(form)) ||
      inSubnets(ip, extra.subnets);
  }

  #extraKnown(): Promise<Known> {
    const extra = this.#extra;
    if (!extra) return Promise.resolve({ forms: new Set(), subnets: [] });
    const now = Date.now();
    if (!this.#cached || now - this.#cached.at > this.#ttlMs) {
      // The interfaces are the ground truth; a source that fails adds nothing this time.
      const known = extra().then(
        (entries) => {
          const found: Known = { forms: new Set(), subnets: [] };
          for (const entry of entries) {
            if (entry.includes("/")) {
              const s = subnet(entry);
              if (s) found.subnets.push(s);
            } else for (const form of addressForms(entry)) found.forms.add(form);
          }
          return found;
        },
        (): Known => ({ forms: new Set(), subnets: [] }),
      );
      this.#cached = { at: now, known };
    }
    return this.#cached.known;
  }
}

interface Known {
  forms: Set<string>;
  subnets: Array<{ value: bigint; width: number; prefix: number }>;
}
