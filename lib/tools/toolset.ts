/**
 * Toolsets: task-specific tools offered to the agent over MCP. A toolset is an MCP server the
 * user already has (a stdio command, or a streamable-HTTP URL), or tools written here in
 * TypeScript with zod parameters ({@link defineToolset}), served in-process. The harness
 * offers each tool as `<toolset>_<tool>`.
 *
 * ```ts
 * const counter = defineToolset({
 *   name: "counter",
 *   tools: {
 *     add: {
 *       description: "Add to the counter",
 *       parameters: { by: z.number() },
 *       run: ({ by }, { state }) => String((state.count = Number(state.count ?? 0) + by)),
 *     },
 *   },
 * });
 * ```
 * @module
 */
import type { z } from "npm:zod@^4.6.0";

/** What a TypeScript tool gets besides its arguments. */
export interface ToolRunContext {
  /** The rollout's state: shared with the task's hooks and rewards (one object per rollout). */
  state: Record<string, unknown>;
  signal?: AbortSignal;
}

/** A tool written in TypeScript. */
export interface ToolDef {
  description: string;
  /** Parameters as zod schemas by name (an object's shape). */
  parameters: Record<string, z.ZodType>;
  /** The result text (an object is sent as JSON); a throw is returned to the model as an error. */
  run(
    args: Record<string, unknown>,
    ctx: ToolRunContext,
  ): string | object | Promise<string | object>;
}

/** A toolset: where its tools come from, and how long a call may take. */
export interface ToolsetSpec {
  /** The server name; its tools are offered as `<name>_<tool>`. */
  name: string;
  /** stdio: the command that starts the MCP server, its arguments, environment and folder. */
  command?: string;
  args?: string[];
  env?: Record<string, string>;
  cwd?: string;
  /**
   * Run the stdio server inside the agent's sandbox instead of on the evaluator: `command`
   * (which the image must be able to run: a binary, `python3 server.py`, ...) starts there,
   * with `env` and `cwd` (a sandbox path), as the agent's user. Default false.
   */
  colocated?: boolean;
  /** A streamable-HTTP MCP server. */
  url?: string;
  /**
   * HTTP headers sent to a `url` server. Values may hold `${VAR}` (or `${VAR:-default}`)
   * templates, resolved from the environment each time the toolset connects and never saved.
   */
  headers?: Record<string, string>;
  /** OAuth for a `url` server that requires it (see {@link ToolsetOAuth}). */
  oauth?: ToolsetOAuth;
  /**
   * How the server's elicitation requests (`elicitation/create`) are answered: `"decline"`
   * (the default) or `"cancel"`, or `{ accept: { ... } }`, a fixed answer (the schema's
   * defaults fill what it leaves out). Nobody is asked: a rollout runs unattended.
   */
  elicitation?: "decline" | "cancel" | { accept: Record<string, unknown> };
  /**
   * Whether the model takes images: an image in a result then reaches it as an image part
   * of the tool message (a data URL) beside the text. Default false: the text names the
   * image, its type and size.
   */
  images?: boolean;
  /** Tools written in TypeScript, served in-process. */
  tools?: Record<string, ToolDef>;
  /** Seconds one call may take; default 60. */
  timeout?: number;
  /**
   * Opened once for the whole run and shared by every rollout (a run-level toolset only): its
   * state is the run's, not a rollout's. Default false: one per rollout.
   */
  shared?: boolean;
}

/**
 * OAuth for a URL toolset. One of:
 * - a bearer `token` (typically `"${MY_TOKEN}"`, from the environment);
 * - the client-credentials grant (`grant = "client_credentials"`, the default with a
 *   `client_id`): `client_id` with `client_secret` (sent as HTTP Basic) or `private_key` (a
 *   PEM key signing a JWT assertion with `algorithm`, default ES256);
 * - the authorization-code grant (`grant = "authorization_code"`): a pre-registered
 *   `client_id` (and `client_secret` for a confidential client), a `client_metadata_url`, or
 *   neither (vf registers itself). The redirect URI is `redirect_uri` (a loopback address,
 *   default `http://127.0.0.1:<a free port>/callback`); a server that needs a person prints
 *   its URL once and waits `authorize_timeout` seconds (default 300);
 * - cross-app access (`grant = "cross_app"`): the user's `id_token` from an identity provider,
 *   exchanged at its `idp_token_endpoint` (as `idp_client_id` if given), and the grant it gives
 *   presented by `client_id`/`client_secret`.
 *
 * The authorization server is discovered from the MCP server's metadata; `issuer` pins the one
 * the client credentials may go to. String values may be `${VAR}` templates, resolved when the
 * toolset connects and never saved; tokens stay in memory for the run.
 */
export interface ToolsetOAuth {
  token?: string;
  grant?: "client_credentials" | "authorization_code" | "cross_app";
  client_id?: string;
  client_secret?: string;
  private_key?: string;
  algorithm?: string;
  scope?: string;
  issuer?: string;
  client_metadata_url?: string;
  redirect_uri?: string;
  authorize_timeout?: number;
  id_token?: string;
  idp_token_endpoint?: string;
  idp_client_id?: string;
}

/** A toolset of TypeScript tools (see the module doc). */
export function defineToolset(spec: ToolsetSpec & { tools: Record<string, ToolDef> }): ToolsetSpec {
  return spec;
}

/** Server names: letters, digits, `-` (the tool name joins them with `_`). */
export const TOOLSET_NAME = /^[A-Za-z0-9-]+$/;
