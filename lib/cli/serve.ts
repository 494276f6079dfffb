/**
 * `vf serve`: one environment or taskset over HTTP and/or ZeroMQ for trainers and evaluators,
 * one env-server core under both transports.
 * @module
 */

import process from "node:process";
import yargsParser from "npm:yargs-parser@^22.0.0";
import { BUILTINS } from "../../environments/mod.ts";
import type { Environment } from "../legacy/environment.ts";
import { ConfigError, describeError } from "../errors.ts";
import { terminalText } from "../util/terminal.ts";
import { loadEnvironment } from "../legacy/load.ts";
import { EnvServerCore } from "../serve/core.ts";
import { type EnvServer, type EnvServerOptions, startEnvServer } from "../serve/server.ts";
import { DEFAULT_ZMQ_ADDRESS, startZmqEnvServer, type ZmqEnvServer } from "../serve/zmq.ts";
import { DEFAULT_ZMQ_WIRE, ZMQ_WIRES, type ZmqWire } from "../serve/wire.ts";
import { isTasksetSpec, tasksetServeRunner } from "./serve_taskset.ts";
import { startWorkerFront, type WorkerFront, WorkerPool } from "../serve/workers.ts";
import { startZmqBroker, type ZmqBroker } from "../serve/zmq_broker.ts";
import { loadZmq, ZMQ_IMPLS, type ZmqImpl } from "../serve/_zmq.ts";
import { readFile } from "node:fs/promises";
import { flagsToConfig } from "./args.ts";
import { env } from "./resolve.ts";

const SERVE_HELP = `vf serve <env|taskset> [options]

Serves one environment or taskset over HTTP so trainers and evaluators elsewhere can run
rollouts with it: GET /health, GET /info, POST /run {task_data, client, model, sampling} ->
{success, error, episode} (one episode, as over ZeroMQ), POST /cancel; a legacy environment
also POST /dataset and POST /rollouts (NDJSON stream).
Evaluate through it with: vf eval <env> --server http://HOST:PORT -m <model> -b <url> -k <VAR>
  --port <p>                  port (default 8123; 0 picks a free one)
  --host <addr>               interface (default 127.0.0.1)
  -c, --max-concurrent <n>    groups and runs at once across all requests, over HTTP and
                              ZeroMQ together (default 32)
  --env-args <json>           arguments for loadEnvironment()
  -x, --extra-env-kwargs <json>  settings applied to the loaded env
  --timeout <seconds>         wall-clock limit per rollout
  --allow-key-var <NAME>      a variable requests may name as client.api_key_var to use this
                              server's key (repeatable; by default none is ever read)
  --workers <n>               up to n worker processes behind the one port (default 1: none):
                              starts with one, adds one whenever every worker has groups
                              waiting; GET /health reports each worker's load. With
                              --zmq: n workers from the start behind a ZeroMQ broker
                              (each run to the worker with the fewest in flight; health
                              answered by the broker); HTTP, if served, uses the same ones
  --tls-cert <pem> --tls-key <pem>  serve HTTPS (with --workers: at the front)
  --zmq [address]             also serve verifiers' ZeroMQ + msgpack wire (what prime-rl
                              speaks) at address (default ${DEFAULT_ZMQ_ADDRESS}; port 0
                              picks a free one): health, run {task_data, client, model,
                              sampling} -> {success, error, episode}, cancel {request_id}.
                              A taskset given --zmq without --port is served over ZeroMQ
                              only
  --wire <form>               the form of the ZeroMQ wire: 2026-09 (default; verifiers'
                              serve since September 2026: replies [request_id, kind, data],
                              a run's episode streamed as per-turn deltas, info) or 2026-08
                              (replies [request_id, data], the whole episode in one reply)
  --zmq-impl <impl>           the ZeroMQ transport: zmtp (default; ZMTP 3.1 written in vf,
                              works in the single binary) or addon (the zeromq package's
                              libzmq; not in the single binary)
A taskset (file-sum, or a module exporting loadTaskset()) has its [env] set with --env.*
flags as for vf run (warm pools: --env.agent.runtime.warm_pool,
--env.agent.scoring.runtime.warm_pool) and its sandboxes bounded by --limits.*; a legacy
environment's run is one rollout of the row its task_data maps to.
Requests carry the model endpoint and its API key: keep the server on loopback, or behind
TLS on a trusted network. When VF_SERVER_TOKEN is set, HTTP requests must send it as a bearer
token (vf eval --server sends $VF_SERVER_TOKEN). Runs until SIGINT or SIGTERM.
`;

export async function cmdServe(argv: string[]): Promise<number> {
  const flags = yargsParser(argv, {
    configuration: {
      "camel-case-expansion": false,
      "parse-numbers": false,
      "parse-positional-numbers": false,
    },
    boolean: ["help", "h"],
    string: [
      "host",
      "env-args",
      "x",
      "extra-env-kwargs",
      "allow-key-var",
      "tls-cert",
      "tls-key",
      "zmq",
      "wire",
      "zmq-impl",
    ],
    number: ["port", "c", "max-concurrent", "timeout", "workers"],
  });
  if (flags.help || flags.h) {
    process.stdout.write(SERVE_HELP);
    return 0;
  }
  const positional = flags._.map(String);
  if (positional.length !== 1) {
    throw new ConfigError(
      "vf serve needs one environment or taskset: vf serve gsm8k --port 8123",
    );
  }
  const config = flagsToConfig(flags as Record<string, unknown>);
  const last = (v: unknown) => (Array.isArray(v) ? v[v.length - 1] : v);
  const port = Number(last(flags.port) ?? 8123);
  const maxConcurrent = Number(last(flags.c ?? flags["max-concurrent"]) ?? 32);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new ConfigError(`--port ${port} is not a port number`);
  }
  if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
    throw new ConfigError(`-c/--max-concurrent must be an integer ≥ 1, got ${maxConcurrent}`);
  }
  const hostname = String(last(flags.host) ?? "127.0.0.1");
  const certPath = last(flags["tls-cert"]);
  const keyPath = last(flags["tls-key"]);
  if (Boolean(certPath) !== Boolean(keyPath)) {
    throw new ConfigError("--tls-cert and --tls-key go together");
  }
  const tls = certPath
    ? {
      cert: await readFile(String(certPath), "utf8"),
      key: await readFile(String(keyPath), "utf8"),
    }
    : undefined;
  const workers = Number(last(flags.workers) ?? 1);
  if (!Number.isInteger(workers) || workers < 1) {
    throw new ConfigError(`--workers must be an integer ≥ 1, got ${last(flags.workers)}`);
  }
  const wireFlag = String(last(flags.wire) ?? DEFAULT_ZMQ_WIRE);
  if (!(ZMQ_WIRES as readonly string[]).includes(wireFlag)) {
    throw new ConfigError(
      `--wire "${wireFlag}" is not a form of the ZeroMQ wire; choose one of ${
        ZMQ_WIRES.map((w) => `"${w}"`).join(", ")
      }`,
    );
  }
  const wire = wireFlag as ZmqWire;
  const implFlag = String(last(flags["zmq-impl"]) ?? "zmtp");
  if (!(ZMQ_IMPLS as readonly string[]).includes(implFlag)) {
    throw new ConfigError(
      `--zmq-impl "${implFlag}" is not a ZeroMQ transport; choose one of ${
        ZMQ_IMPLS.map((i) => `"${i}"`).join(", ")
      }`,
    );
  }
  const impl = implFlag as ZmqImpl;
  const zmqFlag = last(flags.zmq);
  const zmqAddress = zmqFlag === undefined ? null : String(zmqFlag) || DEFAULT_ZMQ_ADDRESS;
  const allowKeyVars = [flags["allow-key-var"] ?? []].flat().map(String);
  const isTaskset = await isTasksetSpec(positional[0], BUILTINS);
  // A taskset given --zmq alone is served over ZeroMQ only; --port adds HTTP.
  const http = !isTaskset || zmqAddress === null || flags.port !== undefined;
  const token = env("VF_SERVER_TOKEN") || undefined;
  if (workers > 1) {
    return await servePool(workerArgsOf(argv), workers, {
      zmq: zmqAddress,
      wire,
      impl,
      http: http ? { port, hostname, token, tls } : undefined,
    });
  }
  // One core under both transports: one limit (-c), one set of requests to cancel.
  let core: EnvServerCore;
  let environment: Environment | null = null;
  let evalDefaults: EnvServerOptions["evalDefaults"] = null;
  if (isTaskset) {
    core = new EnvServerCore(await tasksetServeRunner(positional[0], argv), {
      maxConcurrent,
      allowKeyVars,
    });
  } else {
    const loaded = await loadEnvironment(
      positional[0],
      (config.env_args ?? {}) as Record<string, unknown>,
      BUILTINS,
    );
    environment = loaded.env as Environment;
    try {
      await environment.getEvalDataset();
    } catch (error) {
      const reason = error instanceof ConfigError ? error.message : describeError(error);
      throw new ConfigError(`Environment "${positional[0]}": ${reason}`, { cause: error });
    }
    if (config.extra_env_kwargs) {
      environment.setKwargs(config.extra_env_kwargs as Record<string, unknown>);
    }
    if (flags.timeout !== undefined) {
      environment.setKwargs({ timeout_seconds: Number(last(flags.timeout)) });
    }
    evalDefaults = loaded.module.evalDefaults ?? null;
    core = new EnvServerCore(environment, {
      maxConcurrent,
      allowKeyVars,
      envId: environment.envId || loaded.id,
    });
  }
  let server: EnvServer | null = null;
  let zmqServer: ZmqEnvServer | null = null;
  try {
    if (http) {
      server = await startEnvServer(core, { port, hostname, evalDefaults, token, tls });
    }
    if (zmqAddress !== null) {
      zmqServer = await startZmqEnvServer(core, { address: zmqAddress, wire, impl });
    }
  } catch (error) {
    await server?.close();
    await core.close();
    await environment?.teardown().catch(() => {});
    throw error;
  }
  const loopback = ["127.0.0.1", "localhost", "::1"].includes(hostname);
  if (server && !loopback && !token) {
    process.stderr.write(
      `warning: serving on ${
        terminalText(hostname)
      } without VF_SERVER_TOKEN: anyone who reaches the port can run rollouts, ` +
        `and model keys travel in request bodies; use a trusted network and TLS\n`,
    );
  }
  if (isTaskset) {
    if (server) {
      process.stdout.write(
        `vf serve: taskset "${terminalText(core.id)}" at ${
          terminalText(server.url)
        } (${maxConcurrent} runs at once)\n`,
      );
    }
    if (zmqServer) {
      process.stdout.write(
        `vf serve: taskset "${terminalText(core.id)}" over ZeroMQ at ${
          terminalText(zmqServer.address)
        } ` +
          `(${maxConcurrent} runs at once${server ? ", shared with HTTP" : ""})\n`,
      );
    }
  } else {
    process.stdout.write(
      `vf serve: environment "${terminalText(core.id)}" at ${
        terminalText(server!.url)
      } (${maxConcurrent} groups at once)\n`,
    );
    if (zmqServer) {
      process.stdout.write(`vf serve: ZeroMQ at ${terminalText(zmqServer.address)}\n`);
    }
  }
  return await untilSignal("the env server", async () => {
    await server?.close();
    await zmqServer?.close();
    await core.close();
    await environment?.teardown().catch(() => {});
  });
}

/** The arguments a worker runs with: the parent's, less what only the front or broker uses. */
function workerArgsOf(argv: string[]): string[] {
  const valued = ["--workers", "--port", "--host", "--tls-cert", "--tls-key"];
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (valued.includes(arg)) {
      i++;
    } else if (arg === "--zmq") {
      if (argv[i + 1] !== undefined && !argv[i + 1].startsWith("-")) i++; // its optional address
    } else if (![...valued, "--zmq"].some((flag) => arg.startsWith(`${flag}=`))) {
      args.push(arg);
    }
  }
  return args;
}

/**
 * `--workers N`: N worker processes, behind an HTTP front (which adds workers under load when
 * it is alone) and, with `--zmq`, a ZeroMQ broker; both dispatch to the same processes, so
 * with `--zmq` all N start at once.
 */
async function servePool(
  workerArgs: string[],
  workers: number,
  serve: {
    zmq: string | null;
    wire: ZmqWire;
    impl: ZmqImpl;
    http?: {
      port: number;
      hostname: string;
      token?: string;
      tls?: { cert: string; key: string };
    };
  },
): Promise<number> {
  // Where ZeroMQ cannot load (the Bun-built binary), say why before starting any worker.
  if (serve.zmq !== null && serve.impl === "addon") await loadZmq();
  const pool = await WorkerPool.start({
    workerArgs,
    maxWorkers: workers,
    initial: serve.zmq === null ? 1 : workers,
    http: serve.http !== undefined,
    zmq: serve.zmq !== null,
  });
  let front: WorkerFront | undefined;
  let broker: ZmqBroker | undefined;
  try {
    if (serve.http) {
      front = await startWorkerFront({ workerArgs, maxWorkers: workers, pool, ...serve.http });
      const many = serve.zmq === null ? `up to ${workers}` : String(workers);
      process.stdout.write(`vf serve: ${many} workers at ${terminalText(front.url)}\n`);
    }
    if (serve.zmq !== null) {
      broker = await startZmqBroker(pool, {
        address: serve.zmq,
        wire: serve.wire,
        impl: serve.impl,
      });
      process.stdout.write(
        `vf serve: "${terminalText(broker.envId)}" over ZeroMQ at ${
          terminalText(broker.address)
        } (a broker in front of ` +
          `${workers} workers)\n`,
      );
    }
  } catch (error) {
    await front?.close();
    await pool.close();
    throw error;
  }
  return await untilSignal("the env server and its workers", async () => {
    await front?.close();
    await pool.close(); // the broker relays the workers' last replies meanwhile
    await broker?.close();
  });
}

/** Wait for SIGINT or SIGTERM, then stop `what` with `stop`; the exit code. */
async function untilSignal(what: string, stop: () => Promise<void>): Promise<number> {
  const signal = Promise.withResolvers<string>();
  const onSignal = (sig: string) => signal.resolve(sig);
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  // A parent that stopped reading stderr must not keep the workers and their sockets alive.
  const ignore = () => {};
  process.stderr.on("error", ignore);
  try {
    const sig = await signal.promise;
    try {
      process.stderr.write(`${sig}: stopping ${what}\n`);
    } catch { /* stderr is gone */ }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await stop();
    process.stderr.off("error", ignore);
  }
  return 0;
}
