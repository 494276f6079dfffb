/**
 * Compose specs parsed once for as long as a {@link ComposeCache} lives (a run): a file by the
 * path it resolves to, a document (what a task's `deploymentSpec()` returns) by identity. The
 * parsed form is data (nothing mutates it), so every rollout of the run shares it and starts
 * its own services from it.
 * @module
 */
import { resolve } from "node:path";
import { loadServices, type ServicesSpec } from "./compose.ts";

/** A Compose spec, checked, and the folder its relative paths are read from. */
export type LoadedServices = ServicesSpec & { dir: string };

/** Options of {@link ComposeCache}. */
export interface ComposeCacheOptions {
  /** What parses a spec the cache has not seen; default {@link loadServices}. */
  parse?: (spec: string | Record<string, unknown>) => Promise<LoadedServices>;
}

/** Parses each distinct Compose file or document once; a bad one rejects every caller alike. */
export class ComposeCache {
  #files = new Map<string, Promise<LoadedServices>>();
  #documents = new WeakMap<object, Promise<LoadedServices>>();
  #parse: (spec: string | Record<string, unknown>) => Promise<LoadedServices>;

  constructor(options: ComposeCacheOptions = {}) {
    this.#parse = options.parse ?? loadServices;
  }

  /**
   * The services of `spec`, parsed on first use.
   * @param spec a Compose file's path (from the cwd) or a Compose document
   * @throws {ConfigError} naming the file and key, as {@link loadServices} does
   */
  load(spec: string | Record<string, unknown>): Promise<LoadedServices> {
    if (typeof spec === "string") {
      const key = resolve(spec);
      let loaded = this.#files.get(key);
      if (!loaded) this.#files.set(key, loaded = this.#parse(spec));
      return loaded;
    }
    let loaded = this.#documents.get(spec);
    if (!loaded) this.#documents.set(spec, loaded = this.#parse(spec));
    return loaded;
  }
}
