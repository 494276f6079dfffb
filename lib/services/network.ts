/**
 * A rollout's own Docker network. It is always `internal` and its bridge has no address on
 * the host (`inhibit_ipv4`), so nothing on it reaches the host or beyond: a task with internet
 * access (`network = true`) gets it through the egress proxy under an open policy, which still
 * refuses the evaluator's own host. The only way out is the gateway relay, a busybox `nc` container joined to the network as
 * `vf-gateway` that forwards to one port of the evaluator (the model gateway and egress proxy).
 * Everything is labelled with the run, and the relay is in the ledger, so `vf cleanup`
 * removes what an interrupted run left.
 * @module
 */
import { networkInterfaces } from "node:os";
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";
import { DockerRuntime } from "../../runtimes/docker/mod.ts";
import { ownerLabels } from "../../runtimes/owner.ts";
import { InfraError } from "../errors.ts";

/** The name a sandbox reaches the gateway by, and the port the relay listens on. */
export const GATEWAY_ALIAS = "vf-gateway";
/** The relay's port inside the rollout network. */
export const GATEWAY_PORT = 8080;
/** The image the relay runs (`nc -ll -e` of busybox). */
export const RELAY_IMAGE = "busybox:latest";

function hex(n: number): string {
  return [...crypto.getRandomValues(new Uint8Array(n))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The evaluator's address as containers on the default bridge see it (the bridge's
 * gateway): the gateway listens there, and relays forward to it.
 * @throws {InfraError} when the engine is not on this machine (a remote engine's containers
 * cannot reach the evaluator this way)
 */
export async function evaluatorHost(): Promise<string> {
  const engine = DockerEngine.shared();
  if (!engine.endpoint.socketPath) {
    throw new InfraError(
      `The model gateway and egress proxy need the Docker engine on this machine (a unix ` +
        `socket); "${engine.endpoint.display}" is remote`,
    );
  }
  const bridge = await engine.inspectNetwork("bridge") as {
    IPAM?: { Config?: Array<{ Gateway?: string }> };
    Options?: Record<string, string>;
  } | undefined;
  const gateway =
    bridge?.IPAM?.Config?.find((c) => c.Gateway && !c.Gateway.includes(":"))?.Gateway ??
      bridgeAddress(bridge?.Options?.["com.docker.network.bridge.name"]);
  if (!gateway) {
    throw new InfraError(
      `The Docker engine's default bridge network has no IPv4 gateway; the sandbox cannot ` +
        `reach the evaluator`,
    );
  }
  return gateway;
}

/**
 * The IPv4 address of the default bridge's interface on this machine, which is its gateway.
 * Some engines (Debian's 20.10 here) leave `Gateway` out of the default bridge's IPAM config
 * when they take the address from an existing `docker0`.
 */
export function bridgeAddress(name: string | undefined): string | undefined {
  if (!name) return undefined;
  try {
    return networkInterfaces()[name]?.find((a) => a.family === "IPv4")?.address;
  } catch {
    return undefined; // no permission to list interfaces: the caller names what is missing
  }
}

/**
 * The addresses by which containers reach this machine on every network of the local
 * engine (each network's gateway, and the address of its bridge on this host), and each
 * network's subnet as `a.b.c.d/n` (other rollouts' services and sandboxes live there), the
 * rollout networks vf creates included: the egress proxy refuses them unless a task names one.
 * Empty for a remote engine, whose networks are not this machine's.
 */
export async function dockerNetworkAddresses(): Promise<string[]> {
  const engine = DockerEngine.shared();
  if (!engine.endpoint.socketPath) return [];
  const networks = await engine.listNetworks() as Array<{
    Id?: string;
    Driver?: string;
    IPAM?: { Config?: Array<{ Gateway?: string; Subnet?: string }> | null };
    Options?: Record<string, string> | null;
  }>;
  const addresses: string[] = [];
  for (const n of networks) {
    for (const c of n.IPAM?.Config ?? []) {
      if (c.Gateway) addresses.push(c.Gateway.replace(/\/\d+$/, ""));
      if (c.Subnet?.includes("/")) addresses.push(c.Subnet);
    }
    if (n.Driver !== "bridge") continue;
    const name = n.Options?.["com.docker.network.bridge.name"] ??
      (n.Id ? `br-${n.Id.slice(0, 12)}` : undefined);
    try {
      for (const a of (name && networkInterfaces()[name]) || []) addresses.push(a.address);
    } catch { /* no permission to list interfaces: the proxy refuses then anyway */ }
  }
  return addresses;
}

/** One rollout's network, and its gateway relay once asked for. */
export class RolloutNetwork {
  readonly name: string;
  readonly #engine: DockerEngine;
  readonly #labels: Record<string, string>;
  readonly #ids: { runId: string; task: string };
  #id = "";
  #relay: DockerRuntime | null = null;

  private constructor(name: string, ids: { runId: string; task: string }) {
    this.name = name;
    this.#engine = DockerEngine.shared();
    this.#ids = ids;
    this.#labels = {
      "vf.managed": "1",
      "vf.run_id": ids.runId,
      "vf.task": ids.task,
      ...ownerLabels(),
    };
  }

  /** Create the network: internal and host-less. */
  static async create(options: { runId: string; task: string }): Promise<RolloutNetwork> {
    const network = new RolloutNetwork(`vf-net-${hex(6)}`, options);
    network.#id = await network.#engine.createNetwork({
      Name: network.name,
      Driver: "bridge",
      Internal: true,
      CheckDuplicate: true,
      Labels: network.#labels,
      Options: { "com.docker.network.bridge.inhibit_ipv4": "true" },
    });
    return network;
  }

  /**
   * Start the relay: `vf-gateway:8080` on this network forwards to `host:port` on the
   * evaluator.
   * @throws {InfraError} when the relay image is missing or the relay does not start
   */
  async relay(host: string, port: number, signal?: AbortSignal): Promise<void> {
    const relay = new DockerRuntime({
      type: "docker",
      image: RELAY_IMAGE,
      network: true,
      command: ["nc", "-ll", "-p", String(GATEWAY_PORT), "-e", "nc", host, String(port)],
      labels: { "vf.role": "gateway-relay" },
    }, this.#ids);
    this.#relay = relay;
    try {
      await relay.start({ signal });
      await this.#engine.connectNetwork(this.#id, relay.id, [GATEWAY_ALIAS]);
    } catch (error) {
      if (signal?.aborted) throw error;
      throw new InfraError(
        `The gateway relay (${RELAY_IMAGE}) did not start: ${(error as Error).message}`,
        { cause: error },
      );
    }
  }

  /** Remove the relay, then the network (once the last container has left it). Idempotent. */
  async stop(): Promise<void> {
    await this.#relay?.stop().catch(() => {});
    this.#relay = null;
    if (!this.#id) return;
    const id = this.#id;
    this.#id = "";
    for (let i = 0; i < 5; i++) {
      try {
        await this.#engine.removeNetwork(id);
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }
}
