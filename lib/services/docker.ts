/**
 * A rollout's services on Docker: each service a container on the rollout's network
 * ({@link RolloutNetwork}) under its name, started in `depends_on` order and waited on until
 * healthy. The agent's sandbox joins the same network. Everything carries the run's labels
 * and the service containers are in the ledger, so `vf cleanup` removes what an interrupted
 * run left.
 * @module
 */
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";
import { DockerRuntime } from "../../runtimes/docker/mod.ts";
import { ownerLabels } from "../../runtimes/owner.ts";
import { InfraError } from "../errors.ts";
import { RolloutNetwork } from "./network.ts";
import type { ServicesSpec } from "./compose.ts";
import { buildImage } from "./build.ts";

/** The running services of one rollout. */
export class ServiceGroup {
  readonly #engine: DockerEngine;
  readonly #containers: DockerRuntime[] = [];
  readonly #networks: RolloutNetwork[] = [];
  readonly #volumes: string[] = [];

  private constructor(engine: DockerEngine) {
    this.#engine = engine;
  }

  /**
   * Start every service on `network`, dependencies first, each waited on when a
   * dependent needs it healthy; then every service with a health check must be healthy.
   * What started is removed again when something fails.
   * @throws {InfraError} when a service exits, turns unhealthy, or is not healthy in time
   */
  static async start(
    spec: ServicesSpec,
    options: {
      runId: string;
      task: string;
      /** The rollout's network (its name). */
      network: string;
      /** Seconds to wait for health; default 60. */
      healthTimeout?: number;
      signal?: AbortSignal;
    },
  ): Promise<ServiceGroup> {
    const engine = DockerEngine.shared();
    if (await engine.isPodman().catch(() => false)) {
      // Checked on podman 4.3 (CNI): a rollout's network is internal, and podman gives
      // internal networks no DNS, so the agent cannot reach a service by name.
      throw new InfraError(
        `Compose services of task "${options.task}" cannot run on podman ` +
          `("${engine.endpoint.display}"): podman gives a rollout's internal network no DNS, ` +
          `so services are not reachable by name; run tasks with services on Docker`,
      );
    }
    const group = new ServiceGroup(engine);
    try {
      // Named volumes and extra networks, fresh for this rollout and labelled with it.
      const suffix = [...crypto.getRandomValues(new Uint8Array(4))]
        .map((b) => b.toString(16).padStart(2, "0")).join("");
      const volumes = new Map<string, string>();
      for (const name of spec.volumes ?? []) {
        const real = await engine.createVolume({
          Name: `vf-vol-${suffix}-${name}`,
          Labels: {
            "vf.managed": "1",
            "vf.run_id": options.runId,
            "vf.task": options.task,
            ...ownerLabels(),
          },
        });
        group.#volumes.push(real);
        volumes.set(name, real);
      }
      const networks = new Map<string, string>([["default", options.network]]);
      for (const name of spec.networks ?? []) {
        const network = await RolloutNetwork.create({ runId: options.runId, task: options.task });
        group.#networks.push(network);
        networks.set(name, network.name);
      }
      const started = new Map<string, DockerRuntime>();
      // Built images first (a tag already present is reused).
      const images = new Map<string, string>();
      for (const s of spec.services) {
        if (s.build) {
          images.set(
            s.name,
            await buildImage(s.name, s.build.context, {
              dockerfile: s.build.dockerfile,
              signal: options.signal,
            }),
          );
        }
      }
      for (const s of spec.services) {
        for (const d of s.dependsOn.filter((d) => d.healthy)) {
          await group.#healthy(d.name, started.get(d.name)!, options);
        }
        const joined = (s.networks ?? [{ name: "default", aliases: [] }]).map((n) => ({
          name: networks.get(n.name)!,
          aliases: [s.name, ...n.aliases],
        }));
        const runtime = new DockerRuntime({
          type: "docker",
          image: images.get(s.name) ?? s.image,
          env: s.env,
          networkName: joined[0].name,
          aliases: joined[0].aliases,
          extraNetworks: joined.slice(1),
          mounts: (s.volumes ?? []).map((v) => ({
            ...v,
            source: v.type === "volume" ? volumes.get(v.source)! : v.source,
          })),
          command: s.command,
          healthcheck: s.healthcheck,
          labels: { "vf.role": "service", "vf.service": s.name },
        }, { runId: options.runId, task: options.task });
        group.#containers.push(runtime);
        await runtime.start({ signal: options.signal });
        started.set(s.name, runtime);
      }
      for (const s of spec.services) {
        if (s.healthcheck && s.healthcheck.test[0] !== "NONE") {
          await group.#healthy(s.name, started.get(s.name)!, options);
        }
      }
      return group;
    } catch (error) {
      await group.stop();
      if (options.signal?.aborted) throw error;
      throw error instanceof InfraError
        ? error
        : new InfraError(`Services did not start: ${(error as Error).message}`, { cause: error });
    }
  }

  async #healthy(
    name: string,
    runtime: DockerRuntime,
    options: { healthTimeout?: number; signal?: AbortSignal },
  ): Promise<void> {
    const deadline = Date.now() + (options.healthTimeout ?? 60) * 1000;
    let last = "starting";
    while (Date.now() < deadline) {
      options.signal?.throwIfAborted();
      const info = await this.#engine.inspectContainer(runtime.id) as {
        State?: { Running?: boolean; ExitCode?: number; Health?: { Status?: string } };
      } | undefined;
      const state = info?.State;
      if (!state?.Running) {
        throw new InfraError(
          `Service "${name}" exited (code ${state?.ExitCode ?? "?"}) before it was healthy`,
        );
      }
      last = state.Health?.Status ?? "no health check";
      if (last === "healthy") return;
      if (last === "unhealthy") break;
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new InfraError(
      `Service "${name}" never became healthy (last status: ${last}) within ${
        options.healthTimeout ?? 60
      }s`,
    );
  }

  /** Remove the services, then their volumes and extra networks. Idempotent. */
  async stop(): Promise<void> {
    await Promise.all(this.#containers.splice(0).map((c) => c.stop().catch(() => {})));
    await Promise.all(this.#networks.splice(0).map((n) => n.stop()));
    await Promise.all(
      this.#volumes.splice(0).map((v) => this.#engine.removeVolume(v).catch(() => false)),
    );
  }
}
