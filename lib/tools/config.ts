/**
 * Toolsets from config: `[[env.toolsets]]` with `name` and one of `command`/`args`/`env`
 * (a stdio MCP server), `url` (streamable HTTP, with `headers` and `oauth`) or `module` (a
 * TypeScript module exporting a toolset, as `default` or `toolset`), plus `timeout` per call,
 * `elicitation` and `images`. Errors name the entry.
 * @module
 */
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { ConfigError } from "../errors.ts";
import { checkToolsets } from "./toolbox.ts";
import type { ToolsetSpec } from "./toolset.ts";

const KEYS = [
  "name",
  "command",
  "args",
  "env",
  "cwd",
  "url",
  "module",
  "timeout",
  "shared",
  "colocated",
  "headers",
  "oauth",
  "elicitation",
  "images",
];

const OAUTH_KEYS = [
  "token",
  "client_id",
  "client_secret",
  "private_key",
  "algorithm",
  "scope",
  "issuer",
  "grant",
  "client_metadata_url",
  "redirect_uri",
  "authorize_timeout",
  "id_token",
  "idp_token_endpoint",
  "idp_client_id",
];

/**
 * The toolsets a config lists, loaded (modules imported from `baseDir`) and checked.
 * @throws {ConfigError} naming `field[i].key`
 */
export async function loadToolsets(
  entries: unknown,
  baseDir: string,
  field = "env.toolsets",
): Promise<ToolsetSpec[]> {
  if (entries === undefined) return [];
  if (!Array.isArray(entries)) throw new ConfigError(`${field}: expected [[${field}]] tables`);
  const specs: ToolsetSpec[] = [];
  for (const [i, raw] of entries.entries()) {
    const at = `${field}[${i}]`;
    if (!raw || typeof raw !== "object") throw new ConfigError(`${at}: expected a table`);
    const e = raw as Record<string, unknown>;
    const unknown = Object.keys(e).filter((k) => !KEYS.includes(k));
    if (unknown.length) {
      throw new ConfigError(
        `${at}: unknown key${unknown.length > 1 ? "s" : ""} ${
          unknown.map((k) => `"${k}"`).join(", ")
        }; a toolset takes ${KEYS.map((k) => `"${k}"`).join(", ")}`,
      );
    }
    const str = (k: string) => {
      if (e[k] !== undefined && typeof e[k] !== "string") {
        throw new ConfigError(`${at}.${k}: expected a string`);
      }
      return e[k] as string | undefined;
    };
    if (
      e.args !== undefined && !(Array.isArray(e.args) && e.args.every((a) => typeof a === "string"))
    ) {
      throw new ConfigError(`${at}.args: expected a list of strings`);
    }
    if (e.timeout !== undefined && typeof e.timeout !== "number") {
      throw new ConfigError(`${at}.timeout: expected seconds (a number)`);
    }
    if (e.shared !== undefined && typeof e.shared !== "boolean") {
      throw new ConfigError(`${at}.shared: expected true or false`);
    }
    if (e.colocated !== undefined && typeof e.colocated !== "boolean") {
      throw new ConfigError(`${at}.colocated: expected true or false`);
    }
    if (e.images !== undefined && typeof e.images !== "boolean") {
      throw new ConfigError(`${at}.images: expected true or false`);
    }
    const strings = (k: string, keys?: string[], numbers: string[] = []) => {
      const v = e[k];
      if (v === undefined) return undefined;
      if (!v || typeof v !== "object" || Array.isArray(v)) {
        throw new ConfigError(`${at}.${k}: expected a table of strings`);
      }
      for (const [name, value] of Object.entries(v)) {
        if (keys && !keys.includes(name)) {
          throw new ConfigError(
            `${at}.${k}.${name}: unknown key; ${k} takes ${keys.map((x) => `"${x}"`).join(", ")}`,
          );
        }
        if (numbers.includes(name)) {
          if (typeof value !== "number") {
            throw new ConfigError(`${at}.${k}.${name}: expected seconds (a number)`);
          }
        } else if (typeof value !== "string") {
          throw new ConfigError(`${at}.${k}.${name}: expected a string`);
        }
      }
      return v as Record<string, string>;
    };
    const headers = strings("headers");
    const oauth = strings("oauth", OAUTH_KEYS, ["authorize_timeout"]) as ToolsetSpec["oauth"];
    let elicitation = e.elicitation as ToolsetSpec["elicitation"];
    if (elicitation !== undefined && typeof elicitation === "object") {
      const keys = Object.keys(elicitation);
      if (keys.length !== 1 || keys[0] !== "accept") {
        throw new ConfigError(
          `${at}.elicitation: expected "decline", "cancel" or { accept = { ... } } (the answer)`,
        );
      }
      elicitation = { accept: (elicitation as { accept: Record<string, unknown> }).accept };
    }
    const colocated = e.colocated === true;
    let spec: ToolsetSpec = {
      name: str("name") as string,
      command: str("command"),
      args: e.args as string[] | undefined,
      env: e.env as Record<string, string> | undefined,
      // A colocated server's folder is a path in the sandbox; otherwise one here.
      cwd: str("cwd") ? (colocated ? str("cwd") : resolve(baseDir, str("cwd")!)) : undefined,
      colocated: colocated || undefined,
      url: str("url"),
      headers,
      oauth,
      elicitation,
      images: e.images as boolean | undefined,
      timeout: e.timeout as number | undefined,
      shared: e.shared as boolean | undefined,
    };
    const module = str("module");
    if (module) {
      const path = isAbsolute(module) ? module : resolve(baseDir, module);
      let loaded: Record<string, unknown>;
      try {
        loaded = await import(pathToFileURL(path).href);
      } catch (error) {
        throw new ConfigError(`${at}.module: cannot load "${module}": ${(error as Error).message}`);
      }
      const exported = (loaded.default ?? loaded.toolset) as ToolsetSpec | undefined;
      if (!exported || typeof exported !== "object" || !exported.tools) {
        throw new ConfigError(
          `${at}.module: "${module}" exports no toolset (export default defineToolset({ ... }))`,
        );
      }
      spec = {
        ...exported,
        name: spec.name ?? exported.name,
        timeout: spec.timeout ?? exported.timeout,
        shared: spec.shared ?? exported.shared,
      };
    }
    for (const k of Object.keys(spec) as Array<keyof ToolsetSpec>) {
      if (spec[k] === undefined) delete spec[k];
    }
    specs.push(spec);
  }
  checkToolsets(specs, field);
  return specs;
}
