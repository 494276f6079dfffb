/**
 * A Harbor task's `environment/docker-compose.yaml`: service `main`'s overrides of the agent's
 * sandbox, and the other services as sidecars.
 * @module
 */
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import process from "node:process";
import { ConfigError } from "../errors.ts";

const warned = new Set<string>();

/** What a Harbor task's `environment/docker-compose.yaml` says. */
export interface HarborCompose {
  /** Overrides of the agent's service `main`: its image or build folder, its environment. */
  main: { image?: string; build?: string; env: Record<string, string> };
  /** The other services, as a Compose document for the rollout (null: none). */
  sidecars: Record<string, unknown> | null;
}

const MAIN_KEYS = ["image", "build", "environment", "depends_on"];

/**
 * Read `environment/docker-compose.yaml` (or `.yml`) when there is one. As in Harbor, it is
 * laid over the task's base: service `main` is the agent's sandbox (its image from
 * `${MAIN_IMAGE_NAME}`, the Dockerfile, unless it names another), every other service a
 * sidecar on the rollout's network. `${VAR}` and `${VAR:-default}` are filled from the
 * environment.
 * @throws {ConfigError} naming the file and key
 */
export async function readHarborCompose(envDir: string): Promise<HarborCompose | null> {
  const path = ["docker-compose.yaml", "docker-compose.yml"].map((f) => join(envDir, f))
    .find((p) => existsSync(p));
  if (!path) return null;
  const text = (await readFile(path, "utf8")).replace(
    /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}/g,
    (_m, name: string, fallback: string | undefined) =>
      name === "MAIN_IMAGE_NAME" ? _m : process.env[name] ?? fallback ?? "",
  );
  let doc: Record<string, unknown>;
  try {
    const { parse: parseYaml } = await import("npm:yaml@^2.9.1");
    doc = parseYaml(text) ?? {};
  } catch (error) {
    throw new ConfigError(`${path}: not valid YAML: ${(error as Error).message}`);
  }
  const services = { ...(doc.services ?? {}) as Record<string, Record<string, unknown>> };
  const raw = services.main ?? {};
  delete services.main;
  for (const key of Object.keys(raw)) {
    if (!MAIN_KEYS.includes(key)) {
      const note = `${path}: services.main.${key} is not read by vf (ignored)`;
      if (!warned.has(note)) {
        warned.add(note);
        console.warn(note);
      }
    }
  }
  const main: HarborCompose["main"] = { env: {} };
  if (typeof raw.image === "string" && raw.image !== "${MAIN_IMAGE_NAME}") main.image = raw.image;
  if (raw.build !== undefined) {
    const context = typeof raw.build === "string"
      ? raw.build
      : (raw.build as Record<string, unknown>)?.context;
    if (typeof context !== "string") {
      throw new ConfigError(`${path}: services.main.build: give the folder to build from`);
    }
    main.build = resolve(envDir, context);
  }
  if (Array.isArray(raw.environment)) {
    for (const item of raw.environment.map(String)) {
      const eq = item.indexOf("=");
      if (eq > 0) main.env[item.slice(0, eq)] = item.slice(eq + 1);
    }
  } else if (raw.environment && typeof raw.environment === "object") {
    for (const [k, v] of Object.entries(raw.environment)) main.env[k] = v === null ? "" : String(v);
  }
  // The sidecars start before the agent anyway; a dependency on main would never be met.
  for (const s of Object.values(services)) {
    const d = s?.depends_on;
    if (Array.isArray(d)) s.depends_on = d.filter((n) => n !== "main");
    else if (d && typeof d === "object") delete (d as Record<string, unknown>).main;
  }
  const sidecars = Object.keys(services).length
    ? { ...doc, services, "x-vf-dir": envDir, "x-vf-source": path }
    : null;
  return { main, sidecars };
}
