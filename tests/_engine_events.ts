/**
 * Container create/destroy events of vf containers, streamed from the Engine API while a test
 * runs: how many of a run's containers were alive at once, without sampling the container
 * list (which can stall for seconds behind a busy container under a parallel test run).
 * @module
 */

const DOCKER_SOCKET = "/var/run/docker.sock";

/** One container event. */
export interface EngineEvent {
  action: string;
  id: string;
  labels: Record<string, string>;
  timeNano: number;
}

/** Container create/destroy events of vf containers, streamed from the engine while it runs. */
export class EngineEvents implements AsyncDisposable {
  readonly events: EngineEvent[] = [];
  #controller = new AbortController();
  #client = Deno.createHttpClient({ proxy: { transport: "unix", path: DOCKER_SOCKET } });
  #done: Promise<void>;
  #ready: Promise<void>;

  constructor() {
    const filters = encodeURIComponent(JSON.stringify({
      type: ["container"],
      label: ["vf.managed=1"],
      event: ["create", "destroy"],
    }));
    let ready!: () => void;
    this.#ready = new Promise((r) => (ready = r));
    this.#done = (async () => {
      try {
        const res = await fetch(`http://docker/events?filters=${filters}`, {
          client: this.#client,
          signal: this.#controller.signal,
        });
        ready();
        let buffer = "";
        for await (const chunk of res.body!.pipeThrough(new TextDecoderStream())) {
          buffer += chunk;
          let nl;
          while ((nl = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, nl);
            buffer = buffer.slice(nl + 1);
            if (!line.trim()) continue;
            const e = JSON.parse(line);
            const { name: _name, image: _image, ...labels } = e.Actor?.Attributes ?? {};
            this.events.push({ action: e.Action, id: e.Actor?.ID, labels, timeNano: e.timeNano });
          }
        }
      } catch {
        ready();
      }
    })();
  }

  /** Resolves once the engine accepted the subscription. */
  ready(): Promise<void> {
    return this.#ready;
  }

  /** Events of one run. */
  of(runId: string): EngineEvent[] {
    return this.events.filter((e) => e.labels["vf.run_id"] === runId);
  }

  /** The most containers of the run alive at once, replaying create/destroy. */
  maxLive(runId: string): number {
    let live = 0;
    let max = 0;
    for (const e of this.of(runId)) {
      live += e.action === "create" ? 1 : e.action === "destroy" ? -1 : 0;
      max = Math.max(max, live);
    }
    return max;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    // Let the engine deliver the last events before hanging up.
    await new Promise((r) => setTimeout(r, 300));
    this.#controller.abort();
    await this.#done;
    this.#client.close();
  }
}
