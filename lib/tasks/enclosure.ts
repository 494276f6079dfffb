/**
 * What surrounds one sandbox of a rollout: on Docker, a network of its own with the
 * rollout's services on it and, when asked, the gateway relay (the model gateway for an agent
 * program, the egress proxy for a network policy); for a subprocess, the gateway on loopback.
 * The agent's sandbox and an isolated grading sandbox each get one.
 * @module
 */
import { SandboxLimitError, type SandboxSlot } from "../../runtimes/limits.ts";
import type { SandboxSource } from "../../runtimes/pool.ts";
import type { DockerRuntimeSpec, RuntimeSpec } from "../../runtimes/runtime.ts";
import { traitsOf } from "../../runtimes/config.ts";
import { ConfigError } from "../errors.ts";
import { type EgressDenial, Gateway, type GatewayRoute } from "../gateway/gateway.ts";
import { OPEN_POLICY } from "../gateway/policy.ts";
import type { ServicesSpec } from "../services/compose.ts";
import { ServiceGroup } from "../services/docker.ts";
import { evaluatorHost, GATEWAY_ALIAS, GATEWAY_PORT, RolloutNetwork } from "../services/network.ts";

/** What a sandbox needs around it. */
export interface EnclosureNeeds {
  runId: string;
  task: string;
  /** The run's model (what the gateway reports). */
  model: string;
  /** Services to start fresh on the sandbox's network. */
  services: ServicesSpec | null;
  /** A route to the model gateway (an agent program inside the sandbox). */
  gateway: boolean;
  /** Egress through the proxy only (a network policy); setup starts unrestricted. */
  egress: boolean;
  /** The sandbox's DNS name on its network. */
  alias: string;
  /** Seconds to wait for the services' health. */
  healthTimeout?: number;
  signal: AbortSignal;
  /** Told when it starts and stops waiting for its live slots (before anything starts). */
  onQueue?: (waiting: boolean) => void;
}

/** The environment that sends a sandbox's HTTP(S) through the session's egress proxy. */
function proxyEnv(route: GatewayRoute, direct: string[]): Record<string, string> {
  const proxy = `http://vf:${route.session.proxySecret}@${GATEWAY_ALIAS}:${GATEWAY_PORT}`;
  route.proxyUrl = proxy;
  const bypass = [GATEWAY_ALIAS, ...direct].join(",");
  route.noProxy = bypass;
  return {
    HTTP_PROXY: proxy,
    HTTPS_PROXY: proxy,
    http_proxy: proxy,
    https_proxy: proxy,
    NO_PROXY: bypass,
    no_proxy: bypass,
  };
}

/** A sandbox's network, gateway route and services; {@link Enclosure.close} removes them. */
export class Enclosure {
  /** The gateway route, when one was asked for. */
  route: GatewayRoute | null = null;
  #network: RolloutNetwork | null = null;
  #services: ServiceGroup | null = null;
  #slots: SandboxSlot[] = [];

  /** Whether `needs` asks for anything at all. */
  static needed(needs: Pick<EnclosureNeeds, "services" | "gateway" | "egress">): boolean {
    return needs.services !== null || needs.gateway || needs.egress;
  }

  /**
   * Set up what `needs` asks for around a sandbox of `spec`; returns the enclosure, the spec
   * joined to it and, when `source` limits sandboxes of that type, the live slot the sandbox
   * itself is to start on (`AcquireOptions.slot`; the caller releases it if the sandbox never
   * gets it). The enclosure's containers (services, the relay) count against the same limit:
   * their slots and the sandbox's are taken at once, before anything starts, and the
   * enclosure gives its own back when it closes. What was set up is removed again when a
   * later step fails.
   * @throws {ConfigError} when the runtime cannot have it, or the limit cannot ever fit it
   */
  static async open(
    spec: RuntimeSpec,
    needs: EnclosureNeeds,
    source?: SandboxSource,
  ): Promise<{ enclosure: Enclosure; spec: RuntimeSpec; slot?: SandboxSlot }> {
    const enclosure = new Enclosure();
    let slot: SandboxSlot | undefined;
    try {
      slot = await enclosure.#reserve(spec, needs, source);
      return { enclosure, spec: await enclosure.#open(spec, needs), slot };
    } catch (error) {
      await enclosure.close();
      slot?.release();
      throw error;
    }
  }

  /** Slots for the sandbox and the containers beside it, taken at once. */
  async #reserve(
    spec: RuntimeSpec,
    needs: EnclosureNeeds,
    source: SandboxSource | undefined,
  ): Promise<SandboxSlot | undefined> {
    if (!traitsOf(spec).ownNetwork || !source?.reserve) return undefined;
    const services = needs.services?.services.length ?? 0;
    const relay = needs.gateway || needs.egress ? 1 : 0;
    let slots: SandboxSlot[] | null;
    try {
      slots = await source.reserve(spec.type, 1 + services + relay, {
        signal: needs.signal,
        onQueue: needs.onQueue,
      });
    } catch (error) {
      if (!(error instanceof SandboxLimitError)) throw error;
      const parts = [
        "its sandbox",
        ...(services ? [`${services} service${services === 1 ? "" : "s"}`] : []),
        ...(relay ? ["the gateway relay"] : []),
      ];
      throw new ConfigError(
        `Task "${needs.task}" needs ${1 + services + relay} docker containers at once ` +
          `(${parts.join(", ")}), more than [limits] max_sandboxes = ${error.limit} allows; ` +
          `raise it`,
        { cause: error },
      );
    }
    // The sandbox's own slot is the caller's from here: it goes back when the sandbox is
    // removed, which may be after this enclosure closes (a start still under way).
    this.#slots = slots?.slice(1) ?? [];
    return slots?.[0];
  }

  async #open(spec: RuntimeSpec, needs: EnclosureNeeds): Promise<RuntimeSpec> {
    const gateway = Gateway.shared();
    const traits = traitsOf(spec);
    if (traits.gateway === "loopback" && needs.services === null && !needs.egress) {
      const port = await gateway.listen("127.0.0.1");
      this.route = { session: gateway.open(needs.model), url: `http://127.0.0.1:${port}` };
      return spec;
    }
    if (!traits.ownNetwork) {
      throw new ConfigError(
        needs.services
          ? `Task "${needs.task}" has services (Compose); the ${spec.type} runtime cannot run ` +
            `them; use --env.agent.runtime.type docker`
          : `Task "${needs.task}" needs a network of its own (a gateway or a network policy), ` +
            `which the ${spec.type} runtime cannot give`,
      );
    }
    // What can have a network of its own is a container. Its network is internal whatever the
    // task asks: internet access (`network = true`) is the egress proxy under an open policy,
    // so the evaluator's host and other rollouts' containers stay out of reach.
    const container = spec as DockerRuntimeSpec;
    const network = await RolloutNetwork.create({ runId: needs.runId, task: needs.task });
    this.#network = network;
    let env = container.env ?? {};
    if (needs.gateway || needs.egress) {
      const host = await evaluatorHost();
      const port = await gateway.listen(host);
      this.route = {
        session: gateway.open(needs.model),
        url: `http://${GATEWAY_ALIAS}:${GATEWAY_PORT}`,
      };
      await network.relay(host, port, needs.signal);
      if (needs.egress) {
        // Setup is unrestricted (package installs); the caller moves on to stricter phases.
        this.route.session.setPhase("setup", OPEN_POLICY);
        env = {
          ...env,
          ...proxyEnv(this.route, needs.services?.services.map((s) => s.name) ?? []),
        };
      }
    }
    if (needs.services) {
      const group = await ServiceGroup.start(needs.services, {
        runId: needs.runId,
        task: needs.task,
        network: network.name,
        healthTimeout: needs.healthTimeout,
        signal: needs.signal,
      });
      this.#services = group;
      // The phase ended (timeout, interrupt) as they came up.
      needs.signal.throwIfAborted();
    }
    // Never the default bridge beside it (the host and every container on it are there).
    return { ...container, network: false, env, networkName: network.name, aliases: [needs.alias] };
  }

  /**
   * Seal the gateway session, stop the services, remove the network. Idempotent.
   * @returns the connections the egress proxy refused
   */
  async close(): Promise<EgressDenial[]> {
    const route = this.route;
    this.route = null;
    route?.session.close();
    const services = this.#services;
    this.#services = null;
    const network = this.#network;
    this.#network = null;
    const slots = this.#slots;
    this.#slots = [];
    try {
      await services?.stop();
      await network?.stop();
    } finally {
      for (const slot of slots) slot.release();
    }
    return route?.session.denials ?? [];
  }
}
