/**
 * One rollout's registration with the model gateway: its secrets, the network policy of the
 * phase it is in, the connections the egress proxy refused, and the handler that answers its
 * model calls (an SDK's retry of a call already answered is replayed, not asked again).
 * @module
 */
import { Buffer } from "node:buffer";
import type { Response } from "../types.ts";
import type { ResponseDelta } from "../model/client.ts";
import { type ChatCall, GatewayRefusal } from "./chat.ts";
import { CLOSED_POLICY, namedByAllow, type NetworkPolicy, policyAllows } from "./policy.ts";

/** A connection the network policy refused. */
export interface EgressDenial {
  phase: string;
  host: string;
  port: number;
  /** Unix seconds. */
  at: number;
}

/** What answers a rollout's model calls. */
export interface GatewayHandler {
  /**
   * A chat-completions call of the program; throw {@link GatewayRefusal} to refuse it.
   * `onDelta`, given when the program streams, takes the reply's pieces as they come.
   */
  chat(call: ChatCall, onDelta?: (delta: ResponseDelta) => void): Promise<Response>;
  /**
   * One step of vf's shell agent: `output` is what the last command printed (null on the
   * first step); the reply is the next command, or null when the agent is done.
   */
  shellStep?(output: string | null): Promise<string | null>;
}

function secret(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString("base64url");
}

interface Served {
  digest: string;
  response: Response;
}

/** One rollout's registration with the gateway. */
export class GatewaySession {
  /** Bearer token of the model routes (what the program gets as its API key). */
  readonly modelSecret: string = secret();
  /** Password of the egress proxy (`http://vf:<secret>@host:port`). */
  readonly proxySecret: string = secret();
  /** Connections the policy refused, in order. */
  readonly denials: EgressDenial[] = [];
  /** Answers model calls; set by the harness that runs the program. */
  handler: GatewayHandler | null = null;
  #phase = "setup";
  #policy: NetworkPolicy = CLOSED_POLICY;
  #sealed = false;
  #last: Served | null = null;
  #inflight = new Map<string, Promise<Response>>();
  readonly #release: () => void;

  constructor(readonly model: string, release: () => void) {
    this.#release = release;
  }

  /** The phase whose policy applies now. */
  get phase(): string {
    return this.#phase;
  }

  /** The policy that applies now. */
  get policy(): NetworkPolicy {
    return this.#policy;
  }

  /** Whether the rollout has ended (every call is refused). */
  get sealed(): boolean {
    return this.#sealed;
  }

  /** Connections the proxy let out and still holds open (cut when the phase changes). */
  readonly #tunnels = new Set<{ destroy(): void }>();
  /** Refusals past the first 1000 are counted, not kept. */
  deniedBeyond = 0;

  /** Counts phase switches: a check made under an older one is stale. */
  get generation(): number {
    return this.#generation;
  }
  #generation = 0;

  /** Switch to `phase`, under `policy`; connections opened under the old one are cut. */
  setPhase(phase: string, policy: NetworkPolicy): void {
    this.#generation++;
    this.#phase = phase;
    this.#policy = policy;
    this.#cut();
  }

  #cut(): void {
    for (const t of this.#tunnels) t.destroy();
    this.#tunnels.clear();
  }

  /** Keep `socket` until it closes, or until the phase changes or the session ends. */
  hold(socket: { destroy(): void; once(event: "close", fn: () => void): unknown }): void {
    this.#tunnels.add(socket);
    socket.once("close", () => this.#tunnels.delete(socket));
  }

  /** Whether a connection to `host:port` may leave now; a refusal is recorded. */
  egress(host: string, port: number): boolean {
    if (!this.#sealed && policyAllows(this.#policy, host, port)) return true;
    this.refuse(host, port);
    return false;
  }

  /** Whether the current policy names `host` itself in an allow rule for `port`. */
  names(host: string, port: number): boolean {
    return namedByAllow(this.#policy, host, port);
  }

  /** Record a refused connection. */
  refuse(host: string, port: number): void {
    if (this.denials.length < 1000) {
      this.denials.push({ phase: this.#phase, host, port, at: Date.now() / 1000 });
    } else this.deniedBeyond++;
  }

  /** Answer a chat call once per request body: retries replay, duplicates in flight wait. */
  async chat(
    call: ChatCall,
    digest: string,
    retry: boolean,
    onDelta?: (delta: ResponseDelta) => void,
  ): Promise<Response> {
    if (this.#sealed) throw new GatewayRefusal(409, "the rollout has ended");
    if (retry && this.#last?.digest === digest) return this.#last.response;
    // Only an SDK's retry waits for the first attempt: identical requests sent on purpose
    // (n samples in parallel) each get their own answer.
    const pending = retry ? this.#inflight.get(digest) : undefined;
    if (pending) return await pending;
    const handler = this.handler;
    if (!handler) throw new GatewayRefusal(503, "no program is running in this rollout");
    const promise = onDelta ? handler.chat(call, onDelta) : handler.chat(call);
    this.#inflight.set(digest, promise);
    try {
      const response = await promise;
      this.#last = { digest, response };
      return response;
    } finally {
      this.#inflight.delete(digest);
    }
  }

  /** End the rollout's access: later calls get 409, later connections are refused. */
  close(): void {
    if (this.#sealed) return;
    this.#sealed = true;
    this.handler = null;
    this.#cut();
    this.#release();
  }
}

/** How the sandbox reaches the rollout's gateway. */
export interface GatewayRoute {
  session: GatewaySession;
  /** The gateway's base URL as the sandbox sees it (`http://vf-gateway:8080`). */
  url: string;
  /** The egress proxy URL with the rollout's credentials, when egress goes through it. */
  proxyUrl?: string;
  /** Hosts reached directly, not through the proxy (`NO_PROXY`): the gateway, the services. */
  noProxy?: string;
}
