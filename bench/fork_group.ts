/**
 * Fork-per-group on the local Docker engine, measured in the same run: what a group member
 * costs when it runs the task's setup itself, when it starts from the leader's snapshot
 * (`commit`, what vf does), and when it gets the leader's work directory as an archive
 * instead (the alternative the design weighed). The setup writes a small repository: many
 * small files and one larger one, as a checkout would.
 *
 *   deno run -A bench/fork_group.ts [members=8] [files=400] [image=busybox:latest]
 * @module
 */

import { DockerEngine, DockerRuntime } from "../runtimes/docker/mod.ts";
import type { DockerRuntimeSpec } from "../runtimes/runtime.ts";

const members = Number(Deno.args[0] ?? 8);
const files = Number(Deno.args[1] ?? 400);
const image = Deno.args[2] ?? "busybox:latest";
const spec: DockerRuntimeSpec = { type: "docker", image, workdir: "/work" };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function timed<T>(list: number[], fn: () => Promise<T>): Promise<T> {
  const t = performance.now();
  const out = await fn();
  list.push(performance.now() - t);
  return out;
}

/** The task's setup: `files` small source files in a few directories and an 8 MB blob. */
async function setup(rt: DockerRuntime): Promise<void> {
  const script = `i=0; while [ $i -lt ${files} ]; do d=src/m$((i % 20)); mkdir -p $d; ` +
    `printf 'line %s\\n' $(seq 1 40) > $d/f$i.txt; i=$((i + 1)); done; ` +
    `dd if=/dev/urandom of=blob.bin bs=1M count=8 2>/dev/null; sync`;
  const r = await rt.run(["sh", "-c", script]);
  if (r.exit_code !== 0) throw new Error(`setup failed: ${r.stderr}`);
}

async function check(rt: DockerRuntime): Promise<void> {
  const r = await rt.run(["sh", "-c", "ls src/m0 | wc -l; wc -c < blob.bin"]);
  const [count, size] = r.stdout.trim().split(/\s+/).map(Number);
  if (count !== Math.ceil(files / 20) || size !== 8 * 2 ** 20) {
    throw new Error(`member does not hold the setup's work: ${r.stdout}`);
  }
}

async function start(s: DockerRuntimeSpec): Promise<DockerRuntime> {
  const rt = new DockerRuntime(s, { ledger: null });
  await rt.start();
  await rt.channelReady();
  return rt;
}

const plainStart: number[] = [];
const plainSetup: number[] = [];
const forkStart: number[] = [];
const archiveStart: number[] = [];
const archiveIn: number[] = [];
const snapshotMs: number[] = [];
const archiveOutMs: number[] = [];
const removals: Promise<void>[] = [];
const engine = DockerEngine.shared();

try {
  // Warm-up: image in the page cache, connections open.
  removals.push((await start(spec)).stop());

  // 1. Every member sets up on its own.
  for (let i = 0; i < members; i++) {
    const rt = await timed(plainStart, () => start(spec));
    await timed(plainSetup, () => setup(rt));
    await check(rt);
    removals.push(rt.stop());
  }

  // 2. The leader sets up and is committed; members start from the image.
  const leader = await start(spec);
  await setup(leader);
  const snap = await timed(snapshotMs, () => leader.snapshot());
  for (let i = 0; i < members; i++) {
    const rt = await timed(forkStart, () => start({ ...spec, image: snap.image }));
    await check(rt);
    removals.push(rt.stop());
  }

  // 3. The leader's work directory as an archive, restored into plain members.
  const tar = await timed(archiveOutMs, () => leader.archiveOut("/work"));
  for (let i = 0; i < members; i++) {
    const rt = await timed(archiveStart, () => start(spec));
    await timed(archiveIn, () => rt.archiveIn("/", tar));
    await check(rt);
    removals.push(rt.stop());
  }
  removals.push(leader.stop());
  await Promise.all(removals);
  await snap.remove();

  const plainMember = median(plainStart) + median(plainSetup);
  const archiveMember = median(archiveStart) + median(archiveIn);
  console.log(
    `Docker ${
      (await engine.version()).Version
    }, image ${image}; setup writes ${files} files + 8 MB; ` +
      `${members} members each way, sequential; load average ${
        Deno.loadavg().map((x) => x.toFixed(1)).join(", ")
      }\n`,
  );
  console.log("| member of a group | median ms | extra over a plain start |");
  console.log("| --- | ---: | ---: |");
  console.log(`| plain start (channel open) | ${median(plainStart).toFixed(0)} | – |`);
  console.log(
    `| plain start + own setup | ${plainMember.toFixed(0)} | ${median(plainSetup).toFixed(0)} |`,
  );
  console.log(
    `| start from the leader's snapshot (commit) | ${median(forkStart).toFixed(0)} | ${
      (median(forkStart) - median(plainStart)).toFixed(0)
    } |`,
  );
  console.log(
    `| plain start + the leader's workdir restored (archive) | ${archiveMember.toFixed(0)} | ${
      (archiveMember - median(plainStart)).toFixed(0)
    } |`,
  );
  console.log(
    `\nOnce per group: commit ${median(snapshotMs).toFixed(0)} ms; archive of the workdir ${
      median(archiveOutMs).toFixed(0)
    } ms (${(tar.length / 2 ** 20).toFixed(1)} MiB).`,
  );
} finally {
  await Promise.allSettled(removals);
  await DockerEngine.closeShared();
}
