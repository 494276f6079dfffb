/**
 * The endpoint registry (`configs/endpoints.toml`): model aliases mapped to one or more
 * OpenAI-compatible endpoints. Several entries under one alias are replicas, used in turn.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import type { ChatClient, ChatRequestOptions } from "./client.ts";
import { formatIssue, readToml } from "../config.ts";
import { ConfigError } from "../errors.ts";
import type { Messages, Response } from "../types.ts";

/** One registry entry. */
export interface Endpoint {
  model: string;
  url: string;
  key: string;
  headers?: Record<string, string>;
  /** USD per million tokens, when the registry gives prices. */
  price?: { input_per_mtok: number; output_per_mtok: number };
  /** The endpoint's output-token limit (see ClientConfig.max_output_tokens). */
  max_output_tokens?: number;
  /** Whether its model takes `reasoning_effort` (see ClientConfig.reasoning). */
  reasoning?: boolean;
}

const Entry = z.strictObject({
  endpoint_id: z.string().min(1),
  model: z.string().min(1),
  url: z.string().optional(),
  api_base_url: z.string().optional(),
  key: z.string().optional(),
  api_key_var: z.string().optional(),
  type: z.literal("openai_chat_completions").optional(),
  api_client_type: z.literal("openai_chat_completions").optional(),
  headers: z.record(z.string(), z.string()).optional(),
  input_per_mtok: z.number().min(0).optional(),
  output_per_mtok: z.number().min(0).optional(),
  extra_headers: z.record(z.string(), z.string()).optional(),
  max_output_tokens: z.number().int().positive().optional(),
  reasoning: z.boolean().optional(),
});

/** Parse a registry file into alias → replicas. */
export async function loadEndpoints(path: string): Promise<Map<string, Endpoint[]>> {
  const doc = await readToml(path);
  const list = doc.endpoint;
  if (!Array.isArray(list)) {
    throw new ConfigError(`${path}: expected [[endpoint]] tables`);
  }
  const out = new Map<string, Endpoint[]>();
  list.forEach((raw, i) => {
    const r = Entry.safeParse(raw);
    if (!r.success) {
      throw new ConfigError(`${path}: ${formatIssue(r.error.issues[0], `endpoint[${i}]`)}`);
    }
    const e = r.data;
    const url = e.url ?? e.api_base_url;
    const key = e.key ?? e.api_key_var;
    if (e.url && e.api_base_url && e.url !== e.api_base_url) {
      throw new ConfigError(`${path}: endpoint[${i}]: url and api_base_url disagree`);
    }
    if (e.key && e.api_key_var && e.key !== e.api_key_var) {
      throw new ConfigError(`${path}: endpoint[${i}]: key and api_key_var disagree`);
    }
    if (e.headers && e.extra_headers) {
      throw new ConfigError(`${path}: endpoint[${i}]: give headers or extra_headers, not both`);
    }
    if (!url) throw new ConfigError(`${path}: endpoint[${i}].url: required`);
    if (!key) throw new ConfigError(`${path}: endpoint[${i}].key: required`);
    const entry: Endpoint = { model: e.model, url, key, headers: e.headers ?? e.extra_headers };
    if (e.max_output_tokens !== undefined) entry.max_output_tokens = e.max_output_tokens;
    if (e.reasoning !== undefined) entry.reasoning = e.reasoning;
    if (e.input_per_mtok !== undefined || e.output_per_mtok !== undefined) {
      entry.price = {
        input_per_mtok: e.input_per_mtok ?? 0,
        output_per_mtok: e.output_per_mtok ?? 0,
      };
    }
    const replicas = out.get(e.endpoint_id) ?? [];
    if (replicas.length && replicas[0].model !== entry.model) {
      throw new ConfigError(
        `${path}: endpoint "${e.endpoint_id}" maps to two models ("${
          replicas[0].model
        }", "${entry.model}")`,
      );
    }
    replicas.push(entry);
    out.set(e.endpoint_id, replicas);
  });
  return out;
}

/** Spreads requests over replica clients in turn. */
export class RoundRobinClient implements ChatClient {
  #clients: ChatClient[];
  #next = 0;

  constructor(clients: ChatClient[]) {
    if (clients.length === 0) throw new RangeError("RoundRobinClient needs at least one client");
    this.#clients = clients;
  }

  get baseUrl(): string {
    return this.#clients.map((c) => c.baseUrl).join(",");
  }

  get headersFromState(): Record<string, string> {
    return this.#clients[0].headersFromState;
  }

  getResponse(prompt: Messages, model: string, options?: ChatRequestOptions): Promise<Response> {
    const client = this.#clients[this.#next++ % this.#clients.length];
    return client.getResponse(prompt, model, options);
  }
}
