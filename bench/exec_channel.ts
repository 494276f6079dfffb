/**
 * The Docker command channel against one exec per command, measured in the same run on the
 * same engine: median round trip of a small command (`echo`), a small file write and read,
 * and, with a warm pool of one, the time from asking for a sandbox to its first command's
 * answer, against one command's round trip on the channel (the target: ≤ 1.5×): both a command
 * in a tight loop and one sent after the sandbox sat idle for as long as a pooled one does
 * (waking the idle path from the engine to the sandbox's shell costs this VM ~0.5 ms).
 *
 *   deno run -A bench/exec_channel.ts [iterations=50] [images=busybox,python:3.11-slim]
 */

import { DockerEngine, DockerRuntime } from "../runtimes/docker/mod.ts";
import { WarmPool } from "../runtimes/pool.ts";
import type { DockerRuntimeSpec } from "../runtimes/runtime.ts";

const iterations = Number(Deno.args[0] ?? 50);
const images = (Deno.args[1] ?? "busybox,python:3.11-slim").split(",");

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function ops(spec: DockerRuntimeSpec) {
  const rt = new DockerRuntime(spec, { ledger: null });
  await rt.start();
  await rt.channelReady();
  const run: number[] = [];
  const write: number[] = [];
  const read: number[] = [];
  const idle: number[] = [];
  try {
    for (let i = 0; i < iterations; i++) {
      let t = performance.now();
      await rt.run(["echo", "hi"]);
      run.push(performance.now() - t);
      t = performance.now();
      await rt.write("/tmp/bench.txt", `line ${i}\n`);
      write.push(performance.now() - t);
      t = performance.now();
      await rt.read("/tmp/bench.txt");
      read.push(performance.now() - t);
    }
    // The pool's sandbox waits ≥ 50 ms between refill and hand-out below; so does this one.
    for (let i = 0; i < Math.min(iterations, 15); i++) {
      await new Promise((r) => setTimeout(r, 100));
      const t = performance.now();
      await rt.run(["echo", "hi"]);
      idle.push(performance.now() - t);
    }
  } finally {
    await rt.stop();
  }
  return { run: median(run), write: median(write), read: median(read), idle: median(idle) };
}

async function firstCommand(spec: DockerRuntimeSpec) {
  const pool = new WarmPool({ size: 1 });
  const times: number[] = [];
  try {
    (await pool.acquire(spec)).stop(); // fills the pool
    for (let i = 0; i < 5; i++) {
      // Wait for the refill, then time acquire + first command.
      for (let j = 0; j < 200 && pool.stats.ready < 1; j++) {
        await new Promise((r) => setTimeout(r, 50));
      }
      const t = performance.now();
      const rt = await pool.acquire(spec);
      await rt.run(["echo", "hi"]);
      times.push(performance.now() - t);
      await rt.stop();
    }
  } finally {
    await pool.close();
  }
  return median(times);
}

console.log(`| image | op | exec each (ms) | channel (ms) | exec/channel |`);
console.log(`| --- | --- | --- | --- | --- |`);
for (const image of images) {
  const base: DockerRuntimeSpec = { type: "docker", image, workdir: "/tmp" };
  const exec = await ops({ ...base, execChannel: false });
  const channel = await ops(base);
  for (const op of ["run", "write", "read"] as const) {
    console.log(
      `| ${image} | ${op} | ${exec[op].toFixed(1)} | ${channel[op].toFixed(1)} | ${
        (exec[op] / channel[op]).toFixed(1)
      }x |`,
    );
  }
  console.log(
    `| ${image} | run after 100 ms idle | ${exec.idle.toFixed(1)} | ${channel.idle.toFixed(1)} | ${
      (exec.idle / channel.idle).toFixed(1)
    }x |`,
  );
  const first = await firstCommand(base);
  console.log(
    `| ${image} | warm pool: acquire + first command | | ${first.toFixed(1)} | ${
      (first / channel.run).toFixed(2)
    }x one command, ${(first / channel.idle).toFixed(2)}x one after idle |`,
  );
}
await DockerEngine.closeShared();
