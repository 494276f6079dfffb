/**
 * The Compose subset a task's services may use: `services.<name>` with `image` or `build`
 * (a folder within the Compose file's, with its Dockerfile), `command`,
 * `environment`, `healthcheck` (`test`, `interval`, `timeout`, `retries`, `start_period`),
 * `depends_on` (a list, or `condition: service_started | service_healthy`), `ports`
 * (accepted: services are reached by name on the rollout's network, nothing is published),
 * `volumes` (named volumes declared at the top level, fresh per rollout, and bind mounts of
 * folders within the task folder) and `networks` (declared at the top level; `default` is the
 * network the agent is on). Anything else is an error naming the key.
 * @module
 */
import { realpathSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";

/** One service, checked. */
export interface ServiceSpec {
  name: string;
  /** The image; for a service that is built, the tag it is given (or a built tag). */
  image: string;
  /** Built from this folder (absolute) and Dockerfile before it starts. */
  build?: { context: string; dockerfile?: string };
  /** Null: the image's own entrypoint and command. */
  command: string[] | null;
  env: Record<string, string>;
  healthcheck?: {
    test: string[];
    interval?: number;
    timeout?: number;
    retries?: number;
    startPeriod?: number;
  };
  /** Services this one waits for, and whether each must be healthy first. */
  dependsOn: Array<{ name: string; healthy: boolean }>;
  /** Named volumes (by their Compose name) and bind mounts (absolute host folders). */
  volumes: Array<{ type: "volume" | "bind"; source: string; target: string; readOnly: boolean }>;
  /** The networks it joins (Compose names; `default` is the agent's), with extra aliases. */
  networks: Array<{ name: string; aliases: string[] }>;
}

/** A task's services, in an order that starts every dependency first. */
export interface ServicesSpec {
  services: ServiceSpec[];
  /** Named volumes, created fresh for each rollout. */
  volumes?: string[];
  /** Networks besides `default`, created for each rollout (internal). */
  networks?: string[];
}

const KEYS = [
  "expose",
  "image",
  "build",
  "command",
  "environment",
  "healthcheck",
  "depends_on",
  "ports",
  "volumes",
  "networks",
];

function within(root: string, path: string): boolean {
  return path === root || path.startsWith(root + "/");
}

/** `path` with every symlink resolved, as far as it exists (the rest appended as written). */
function real(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    const parent = dirname(path);
    return parent === path ? path : join(real(parent), basename(path));
  }
}

/**
 * Whether `path` is within `root` both as written and once symlinks are resolved: Docker
 * follows a symlink in a bind mount's source or a build context, so `./data -> /` would
 * otherwise hand the host's root to a service.
 */
function realWithin(root: string, path: string): boolean {
  return within(root, path) && within(real(root), real(path));
}

function declared(value: unknown, what: string, at: (p: string) => string): string[] {
  if (value === undefined) return [];
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    throw new ConfigError(at(`${what}: expected a table of names`));
  }
  for (const [name, v] of Object.entries(value)) {
    if (v !== null && (typeof v !== "object" || Object.keys(v).length > 0)) {
      throw new ConfigError(
        at(`${what}.${name}: options are not supported (declare it empty: "${name}: {}")`),
      );
    }
  }
  return Object.keys(value);
}

/** Split a command line as a POSIX shell would: quotes and backslashes, no expansion. */
export function shellSplit(line: string, at: string): string[] {
  const out: string[] = [];
  let word = "";
  let has = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote === "'") {
      if (ch === "'") quote = null;
      else word += ch;
    } else if (quote === '"') {
      if (ch === '"') quote = null;
      else if (ch === "\\" && i + 1 < line.length && '"\\$`'.includes(line[i + 1])) {
        word += line[++i];
      } else word += ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      has = true;
    } else if (ch === "\\" && i + 1 < line.length) {
      word += line[++i];
      has = true;
    } else if (/\s/.test(ch)) {
      if (has || word) out.push(word);
      word = "";
      has = false;
    } else {
      word += ch;
    }
  }
  if (quote) throw new ConfigError(`${at}: unclosed ${quote} quote`);
  if (has || word) out.push(word);
  return out;
}

/** Compose durations: `1m30s`, `500ms`, `2s`, or seconds as a number. */
export function parseDuration(value: unknown, at: string): number {
  if (typeof value === "number" && value >= 0) return value;
  if (typeof value === "string") {
    const parts = [...value.matchAll(/(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)/g)];
    if (parts.length && parts.map((p) => p[0]).join("") === value.trim()) {
      const unit: Record<string, number> = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, ns: 1e-9 };
      return parts.reduce((a, p) => a + Number(p[1]) * unit[p[2]], 0);
    }
  }
  throw new ConfigError(`${at}: "${value}" is not a duration (like "1s", "500ms", "1m30s")`);
}

function strings(value: unknown, at: string): string[] {
  if (
    !Array.isArray(value) || !value.every((v) => typeof v === "string" || typeof v === "number")
  ) {
    throw new ConfigError(`${at}: expected a list of strings`);
  }
  return value.map(String);
}

/**
 * Check a Compose document (an object as parsed from YAML) against the subset.
 * @throws {ConfigError} naming `<source>: services.<name>.<key>`
 */
export function checkCompose(doc: unknown, source: string, baseDir = "."): ServicesSpec {
  const at = (path: string) => `${source}: ${path}`;
  const top = doc as Record<string, unknown> | null;
  if (!top || typeof top !== "object" || !top.services || typeof top.services !== "object") {
    throw new ConfigError(at("services: a Compose file needs a services table"));
  }
  for (const key of Object.keys(top)) {
    if (!["services", "version", "volumes", "networks"].includes(key) && !key.startsWith("x-")) {
      throw new ConfigError(
        at(`${key}: not in the supported Compose subset (services, volumes, networks)`),
      );
    }
  }
  const namedVolumes = declared(top.volumes, "volumes", at);
  const namedNetworks = declared(top.networks, "networks", at).filter((n) => n !== "default");
  const root = resolve(baseDir);
  const raw = top.services as Record<string, Record<string, unknown>>;
  const services: ServiceSpec[] = [];
  for (const [name, s] of Object.entries(raw)) {
    const p = `services.${name}`;
    if (!/^[a-z0-9][a-z0-9_.-]*$/.test(name)) {
      throw new ConfigError(
        at(`${p}: "${name}" is not a service name (lower case, digits, _ . -)`),
      );
    }
    if (!s || typeof s !== "object") throw new ConfigError(at(`${p}: expected a table`));
    for (const key of Object.keys(s)) {
      if (!KEYS.includes(key) && !key.startsWith("x-")) {
        throw new ConfigError(
          at(`${p}.${key}: not in the supported Compose subset (${KEYS.join(", ")})`),
        );
      }
    }
    let build: ServiceSpec["build"];
    if (s.build !== undefined) {
      const b = typeof s.build === "string"
        ? { context: s.build }
        : s.build as Record<string, unknown>;
      for (const key of Object.keys(b ?? {})) {
        if (key !== "context" && key !== "dockerfile") {
          throw new ConfigError(
            at(`${p}.build.${key}: not in the supported Compose subset (context, dockerfile)`),
          );
        }
      }
      if (typeof b.context !== "string" || !b.context) {
        throw new ConfigError(at(`${p}.build.context: the folder to build from`));
      }
      const context = resolve(root, b.context);
      if (!realWithin(root, context)) {
        throw new ConfigError(at(`${p}.build.context: "${b.context}" is outside the task folder`));
      }
      build = { context, dockerfile: typeof b.dockerfile === "string" ? b.dockerfile : undefined };
    }
    if ((typeof s.image !== "string" || !s.image) && !build) {
      throw new ConfigError(at(`${p}.image: every service needs an image or a build`));
    }
    let command: string[] | null = null;
    if (typeof s.command === "string") command = shellSplit(s.command, at(`${p}.command`));
    else if (s.command !== undefined) command = strings(s.command, at(`${p}.command`));
    const env: Record<string, string> = {};
    if (Array.isArray(s.environment)) {
      for (const item of strings(s.environment, at(`${p}.environment`))) {
        const eq = item.indexOf("=");
        env[eq < 0 ? item : item.slice(0, eq)] = eq < 0 ? "" : item.slice(eq + 1);
      }
    } else if (s.environment && typeof s.environment === "object") {
      for (const [k, v] of Object.entries(s.environment)) env[k] = v === null ? "" : String(v);
    } else if (s.environment !== undefined) {
      throw new ConfigError(at(`${p}.environment: expected a table or a list of KEY=value`));
    }
    let healthcheck: ServiceSpec["healthcheck"];
    if (s.healthcheck !== undefined) {
      const h = s.healthcheck as Record<string, unknown>;
      const hp = `${p}.healthcheck`;
      for (const key of Object.keys(h ?? {})) {
        if (!["test", "interval", "timeout", "retries", "start_period"].includes(key)) {
          throw new ConfigError(at(`${hp}.${key}: not in the supported Compose subset`));
        }
      }
      const test = typeof h.test === "string"
        ? ["CMD-SHELL", h.test]
        : strings(h.test, at(`${hp}.test`));
      if (!["CMD", "CMD-SHELL", "NONE"].includes(test[0])) {
        throw new ConfigError(at(`${hp}.test: starts with CMD, CMD-SHELL or NONE`));
      }
      healthcheck = {
        test,
        interval: h.interval === undefined ? 1 : parseDuration(h.interval, at(`${hp}.interval`)),
        timeout: h.timeout === undefined
          ? undefined
          : parseDuration(h.timeout, at(`${hp}.timeout`)),
        retries: typeof h.retries === "number" ? h.retries : undefined,
        startPeriod: h.start_period === undefined
          ? undefined
          : parseDuration(h.start_period, at(`${hp}.start_period`)),
      };
    }
    const dependsOn: ServiceSpec["dependsOn"] = [];
    if (Array.isArray(s.depends_on)) {
      for (const d of strings(s.depends_on, at(`${p}.depends_on`))) {
        dependsOn.push({ name: d, healthy: false });
      }
    } else if (s.depends_on && typeof s.depends_on === "object") {
      for (const [d, c] of Object.entries(s.depends_on as Record<string, { condition?: string }>)) {
        const condition = c?.condition ?? "service_started";
        if (condition !== "service_started" && condition !== "service_healthy") {
          throw new ConfigError(
            at(
              `${p}.depends_on.${d}.condition: "${condition}" is not service_started or service_healthy`,
            ),
          );
        }
        dependsOn.push({ name: d, healthy: condition === "service_healthy" });
      }
    } else if (s.depends_on !== undefined) {
      throw new ConfigError(at(`${p}.depends_on: expected a list or a table`));
    }
    const volumes: ServiceSpec["volumes"] = [];
    if (s.volumes !== undefined) {
      if (!Array.isArray(s.volumes)) throw new ConfigError(at(`${p}.volumes: expected a list`));
      s.volumes.forEach((v: unknown, i: number) => {
        const vp = `${p}.volumes[${i}]`;
        let type: string | undefined;
        let source: string;
        let target: string;
        let readOnly = false;
        if (typeof v === "string") {
          const parts = v.split(":");
          if (parts.length < 2 || parts.length > 3 || (parts[2] && !/^(ro|rw)$/.test(parts[2]))) {
            throw new ConfigError(
              at(`${vp}: "${v}" is not source:target[:ro] (anonymous volumes are not supported)`),
            );
          }
          [source, target] = parts;
          readOnly = parts[2] === "ro";
          type = /^[./~]/.test(source) ? "bind" : "volume";
        } else if (v && typeof v === "object") {
          const o = v as Record<string, unknown>;
          for (const key of Object.keys(o)) {
            if (!["type", "source", "target", "read_only"].includes(key)) {
              throw new ConfigError(at(`${vp}.${key}: not in the supported Compose subset`));
            }
          }
          type = String(o.type ?? "volume");
          source = String(o.source ?? "");
          target = String(o.target ?? "");
          readOnly = o.read_only === true;
        } else {
          throw new ConfigError(at(`${vp}: expected "source:target" or a table`));
        }
        if (!target.startsWith("/")) {
          throw new ConfigError(at(`${vp}: the target "${target}" must be an absolute path`));
        }
        if (type === "bind") {
          const full = resolve(root, source);
          if (!realWithin(root, full)) {
            throw new ConfigError(
              at(`${vp}: "${source}" is outside the task folder (symlinks resolved)`),
            );
          }
          // What was checked is what is mounted.
          volumes.push({ type: "bind", source: real(full), target, readOnly });
        } else if (type === "volume") {
          if (!namedVolumes.includes(source)) {
            throw new ConfigError(
              at(`${vp}: volume "${source}" is not declared under the top-level volumes`),
            );
          }
          volumes.push({ type: "volume", source, target, readOnly });
        } else {
          throw new ConfigError(at(`${vp}.type: "${type}" is not volume or bind`));
        }
      });
    }
    let networks: ServiceSpec["networks"] = [{ name: "default", aliases: [] }];
    if (s.networks !== undefined) {
      const entries: Array<[string, unknown]> = Array.isArray(s.networks)
        ? strings(s.networks, at(`${p}.networks`)).map((n) => [n, null])
        : s.networks && typeof s.networks === "object"
        ? Object.entries(s.networks)
        : (() => {
          throw new ConfigError(at(`${p}.networks: expected a list or a table`));
        })();
      networks = entries.map(([n, o]) => {
        if (n !== "default" && !namedNetworks.includes(n)) {
          throw new ConfigError(
            at(`${p}.networks: network "${n}" is not declared under the top-level networks`),
          );
        }
        const opts = (o ?? {}) as Record<string, unknown>;
        for (const key of Object.keys(opts)) {
          if (key !== "aliases") {
            throw new ConfigError(at(`${p}.networks.${n}.${key}: not in the supported subset`));
          }
        }
        return {
          name: n,
          aliases: opts.aliases === undefined
            ? []
            : strings(opts.aliases, at(`${p}.networks.${n}.aliases`)),
        };
      });
    }
    services.push({
      name,
      image: typeof s.image === "string" ? s.image : "",
      build,
      command,
      env,
      healthcheck,
      dependsOn,
      volumes,
      networks,
    });
  }
  for (const s of services) {
    for (const d of s.dependsOn) {
      const target = services.find((t) => t.name === d.name);
      if (!target) {
        throw new ConfigError(at(`services.${s.name}.depends_on: no service "${d.name}"`));
      }
      if (d.healthy && !target.healthcheck) {
        throw new ConfigError(
          at(
            `services.${s.name}.depends_on.${d.name}: service_healthy needs a healthcheck on "${d.name}"`,
          ),
        );
      }
    }
  }
  // Dependencies first; a cycle is an error.
  const ordered: ServiceSpec[] = [];
  const state = new Map<string, "visiting" | "done">();
  const visit = (s: ServiceSpec, chain: string[]) => {
    if (state.get(s.name) === "done") return;
    if (state.get(s.name) === "visiting") {
      throw new ConfigError(
        at(`services: depends_on goes round: ${[...chain, s.name].join(" -> ")}`),
      );
    }
    state.set(s.name, "visiting");
    for (const d of s.dependsOn) {
      visit(services.find((t) => t.name === d.name)!, [...chain, s.name]);
    }
    state.set(s.name, "done");
    ordered.push(s);
  };
  for (const s of services) visit(s, []);
  return { services: ordered, volumes: namedVolumes, networks: namedNetworks };
}

/**
 * A task's services from what `Task.deploymentSpec()` returns: a Compose document (an
 * object) or the path of a Compose file (YAML).
 * @throws {ConfigError} naming the file and key
 */
export async function loadServices(
  spec: string | Record<string, unknown>,
  baseDir = ".",
): Promise<ServicesSpec & { dir: string }> {
  if (typeof spec !== "string") {
    // A document may say where it came from (`x-vf-dir`, `x-vf-source`: a Harbor task's).
    const dir = typeof spec["x-vf-dir"] === "string" ? spec["x-vf-dir"] : baseDir;
    const source = typeof spec["x-vf-source"] === "string" ? spec["x-vf-source"] : "compose";
    return { ...checkCompose(spec, source, dir), dir: resolve(dir) };
  }
  const path = resolve(baseDir, spec);
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch {
    throw new ConfigError(`Compose file "${spec}" cannot be read`);
  }
  let doc: unknown;
  try {
    const { parse: parseYaml } = await import("npm:yaml@^2.9.1");
    doc = parseYaml(text);
  } catch (error) {
    throw new ConfigError(`${spec}: not valid YAML: ${(error as Error).message}`);
  }
  return { ...checkCompose(doc, spec, dirname(path)), dir: dirname(path) };
}
