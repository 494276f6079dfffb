/**
 * What surrounds one sandbox of a rollout: on Docker, a network of its own with the
 * rollout's services on it and, when asked, the gateway relay (the model gateway for an agent
 * program, the egress proxy for a network policy); for a subprocess, the gateway on loopback.
 * The agent's sandbox and an isolated grading sandbox each get one.
 * @module
 */
import type { RuntimeSpec } from "../../runtimes/runtime.ts";
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

  /** Whether `needs` asks for anything at all. */
  static needed(needs: Pick<EnclosureNeeds, "services" | "gateway" | "egress">): boolean {
    return needs.services !== null || needs.gateway || needs.egress;
  }

  /**
   * Set up what `needs` asks for around a sandbox of `spec`; returns the enclosure and the
   * spec joined to it. What was set up is removed again when a later step fails.
   * @throws {ConfigError} when the runtime cannot have it
   */
  static async open(
    spec: RuntimeSpec,
    needs: EnclosureNeeds,
  ): Promise<{ enclosure: Enclosure; spec: RuntimeSpec }> {
    const enclosure = new Enclosure();
    try {
      return { enclosure, spec: await enclosure.#open(spec, needs) };
    } catch (error) {
      await enclosure.close();
      throw error;
    }
  }

  async #open(spec: RuntimeSpec, needs: EnclosureNeeds): Promise<RuntimeSpec> {
    const gateway = Gateway.shared();
    if (spec.type === "subprocess" && needs.services === null && !needs.egress) {
      const port = await gateway.listen("127.0.0.1");
      this.route = { session: gateway.open(needs.model), url: `http://127.0.0.1:${port}` };
      return spec;
    }
    if (spec.type !== "docker") {
      throw new ConfigError(
        needs.services
          ? `Task "${needs.task}" has services (Compose); the ${spec.type} runtime cannot run ` +
            `them; use --env.agent.runtime.type docker`
          : `Task "${needs.task}" needs a network of its own (a gateway or a network policy), ` +
            `which the ${spec.type} runtime cannot give`,
      );
    }
    const network = await RolloutNetwork.create({
      runId: needs.runId,
      task: needs.task,
      internet: spec.network === true,
    });
    this.#network = network;
    let env = spec.env ?? {};
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
    return { ...spec, env, networkName: network.name, aliases: [needs.alias] };
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
    await services?.stop();
    const network = this.#network;
    this.#network = null;
    await network?.stop();
    return route?.session.denials ?? [];
  }
}
