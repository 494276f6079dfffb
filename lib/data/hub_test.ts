import assert from "node:assert/strict";
import { join } from "node:path";
// deno-lint-ignore no-import-prefix
import { parquetWriteBuffer } from "npm:hyparquet-writer@^0.17.0";
import { ConfigError } from "../errors.ts";
import { loadHubDataset, PARQUET_CONVERSION_REVISION } from "./hub.ts";

type Files = Record<string, Uint8Array | string>;

interface FakeRepo {
  revisions: Record<string, Files>;
  token?: string;
}

/**
 * A loopback server answering the Hub endpoints @huggingface/hub calls: the paginated
 * tree listing and the resolve URL (a `Range: bytes=0-0` probe, then the full file).
 */
class FakeHub implements AsyncDisposable {
  readonly requests: string[] = [];
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #repos: Record<string, FakeRepo>;
  readonly #pageSize: number;

  constructor(repos: Record<string, FakeRepo>, pageSize = 3) {
    this.#repos = repos;
    this.#pageSize = pageSize;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      (request) => this.#handle(request),
    );
  }

  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#server.shutdown();
  }

  async #handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    this.requests.push(
      `${request.headers.get("range") ? "probe " : ""}${url.pathname}${url.search}`,
    );
    const parts = url.pathname.split("/").slice(1).map(decodeURIComponent);
    const api = parts[0] === "api";
    const [kind, owner, name, verb, revision, ...rest] = api ? parts.slice(1) : parts;
    const repo = this.#repos[`${owner}/${name}`];
    if (kind !== "datasets" || !repo) {
      return json({ error: "Repository not found" }, 404, { "X-Error-Code": "RepoNotFound" });
    }
    if (repo.token && request.headers.get("authorization") !== `Bearer ${repo.token}`) {
      return json({ error: "Invalid credentials in Authorization header" }, 401);
    }
    const files = repo.revisions[revision];
    if (!files) {
      return json({ error: "Invalid rev id" }, 404, { "X-Error-Code": "RevisionNotFound" });
    }
    if (api && verb === "tree") return await this.#tree(url, files, rest.join("/"));
    if (!api && verb === "resolve") return this.#resolve(request, files, rest.join("/"));
    return json({ error: "Not found" }, 404);
  }

  async #tree(url: URL, files: Files, prefix: string): Promise<Response> {
    const entries: Record<string, unknown>[] = [];
    const dirs = new Set<string>();
    for (const [path, content] of Object.entries(files).sort()) {
      if (prefix && !path.startsWith(prefix + "/")) continue;
      const segments = path.split("/");
      for (let k = 1; k < segments.length; k++) {
        const dir = segments.slice(0, k).join("/");
        if (!dirs.has(dir)) {
          dirs.add(dir);
          entries.push({ type: "directory", oid: await sha(dir), size: 0, path: dir });
        }
      }
      const bytes = toBytes(content);
      const entry: Record<string, unknown> = {
        type: "file",
        oid: (await sha(path)).slice(0, 40),
        size: bytes.length,
        path,
      };
      if (path.endsWith(".parquet")) {
        entry.lfs = { oid: await sha(bytes), size: bytes.length, pointerSize: 134 };
      }
      entries.push(entry);
    }
    const cursor = Number(url.searchParams.get("cursor") ?? 0);
    const page = entries.slice(cursor, cursor + this.#pageSize);
    const headers: Record<string, string> = {};
    if (cursor + this.#pageSize < entries.length) {
      const next = new URL(url);
      next.searchParams.set("cursor", String(cursor + this.#pageSize));
      headers.Link = `<${next.href}>; rel="next"`;
    }
    return json(page, 200, headers);
  }

  #resolve(request: Request, files: Files, path: string): Response {
    const content = files[path];
    if (content === undefined) {
      return json({ error: "Entry not found" }, 404, { "X-Error-Code": "EntryNotFound" });
    }
    const bytes = toBytes(content);
    const headers = { ETag: `"${bytes.length}"`, "Content-Type": "application/octet-stream" };
    if (request.headers.get("range") === "bytes=0-0") {
      return new Response(bytes.slice(0, 1), {
        status: 206,
        headers: { ...headers, "Content-Range": `bytes 0-0/${bytes.length}` },
      });
    }
    return new Response(bytes, { headers });
  }
}

function json(body: unknown, status: number, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", ...headers },
  });
}

function toBytes(content: Uint8Array | string): Uint8Array<ArrayBuffer> {
  return typeof content === "string" ? new TextEncoder().encode(content) : new Uint8Array(content);
}

async function sha(data: Uint8Array | string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", toBytes(data));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function parquet(rows: { question: string; answer: string }[]): Uint8Array {
  return new Uint8Array(parquetWriteBuffer({
    columnData: [
      { name: "question", data: rows.map((r) => r.question), type: "STRING" },
      { name: "answer", data: rows.map((r) => r.answer), type: "STRING" },
    ],
  }));
}

const row = (i: number) => ({ question: `q${i}`, answer: `a${i}` });

Deno.test("loadHubDataset() concatenates the data/<split>-*.parquet shards of a split in order", async () => {
  await using hub = new FakeHub({
    "acme/qa": {
      revisions: {
        main: {
          "README.md": "# qa",
          "data/train-00000-of-00002.parquet": parquet([row(0), row(1)]),
          "data/train-00001-of-00002.parquet": parquet([row(2)]),
          "data/test-00000-of-00001.parquet": parquet([row(9)]),
        },
      },
    },
  });
  const train = await loadHubDataset("acme/qa", { hubUrl: hub.url });
  assert.deepEqual(train.toList(), [row(0), row(1), row(2)]);
  const test = await loadHubDataset("acme/qa", { hubUrl: hub.url, split: "test" });
  assert.deepEqual(test.toList(), [row(9)]);
  assert.ok(
    hub.requests.some((r) =>
      r.startsWith("/api/datasets/acme/qa/tree/main?") && r.includes("cursor=")
    ),
  );
  assert.ok(
    hub.requests.includes("/datasets/acme/qa/resolve/main/data/test-00000-of-00001.parquet"),
  );
});

Deno.test("loadHubDataset() picks <config>/<split>-*.parquet files and lists configs when none is given", async () => {
  await using hub = new FakeHub({
    "openai/gsm8k": {
      revisions: {
        main: {
          "main/train-00000-of-00001.parquet": parquet([row(1)]),
          "main/test-00000-of-00001.parquet": parquet([row(2), row(3)]),
          "socratic/test-00000-of-00001.parquet": parquet([row(4)]),
        },
      },
    },
  });
  const ds = await loadHubDataset("openai/gsm8k", {
    hubUrl: hub.url,
    config: "main",
    split: "test",
  });
  assert.deepEqual(ds.toList(), [row(2), row(3)]);
  await assert.rejects(
    loadHubDataset("openai/gsm8k", { hubUrl: hub.url, split: "test" }),
    (error) =>
      error instanceof ConfigError &&
      /has several configs; pass config, one of: main, socratic/.test(error.message),
  );
  await assert.rejects(
    loadHubDataset("openai/gsm8k", { hubUrl: hub.url, config: "nope" }),
    /no config "nope"; available configs: main, socratic/,
  );
});

Deno.test("loadHubDataset() reads the refs/convert/parquet branch, falling back to it when main has no data", async () => {
  await using hub = new FakeHub({
    "acme/scripted": {
      revisions: {
        main: { "README.md": "# scripted", "scripted.py": "# a loading script" },
        [PARQUET_CONVERSION_REVISION]: {
          "default/train/0000.parquet": parquet([row(0)]),
          "default/train/0001.parquet": parquet([row(1)]),
          "default/validation/0000.parquet": parquet([row(5)]),
        },
      },
    },
  });
  const train = await loadHubDataset("acme/scripted", { hubUrl: hub.url });
  assert.deepEqual(train.toList(), [row(0), row(1)]);
  const validation = await loadHubDataset("acme/scripted", {
    hubUrl: hub.url,
    revision: PARQUET_CONVERSION_REVISION,
    config: "default",
    split: "validation",
  });
  assert.deepEqual(validation.toList(), [row(5)]);
  assert.ok(
    hub.requests.some((r) =>
      r.startsWith("/api/datasets/acme/scripted/tree/refs%2Fconvert%2Fparquet?")
    ),
  );
});

Deno.test("loadHubDataset() reads JSONL and CSV files named after their split", async () => {
  await using hub = new FakeHub({
    "acme/plain": {
      revisions: {
        main: {
          "train.jsonl": '{"question": "q0", "answer": 1}\n',
          "dev.csv": 'question,answer\n"q, 1","2"\n',
        },
      },
    },
  });
  const train = await loadHubDataset("acme/plain", { hubUrl: hub.url });
  assert.deepEqual(train.toList(), [{ question: "q0", answer: 1 }]);
  const dev = await loadHubDataset("acme/plain", { hubUrl: hub.url, split: "validation" });
  assert.deepEqual(dev.toList(), [{ question: "q, 1", answer: "2" }]);
});

Deno.test("loadHubDataset() names the available splits when the split is missing", async () => {
  await using hub = new FakeHub({
    "acme/qa": {
      revisions: {
        main: {
          "data/train-00000-of-00001.parquet": parquet([row(0)]),
          "data/test-00000-of-00001.parquet": parquet([row(1)]),
        },
      },
    },
  });
  await assert.rejects(
    loadHubDataset("acme/qa", { hubUrl: hub.url, split: "validation" }),
    (error) =>
      error instanceof ConfigError &&
      error.message ===
        'Dataset "acme/qa" (config "default") has no split "validation"; available splits: test, train',
  );
});

Deno.test("loadHubDataset() says the Hub cannot be reached when nothing listens", async () => {
  const closed = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response(),
  );
  const hubUrl = `http://127.0.0.1:${closed.addr.port}`;
  await closed.shutdown();
  await assert.rejects(
    loadHubDataset("openai/gsm8k", { hubUrl, config: "main" }),
    (error) =>
      error instanceof ConfigError &&
      error.message.startsWith(`Cannot reach the Hugging Face Hub at "${hubUrl}"; `),
  );
});

Deno.test("loadHubDataset() reports a missing repo and a refused token as ConfigErrors", async () => {
  await using hub = new FakeHub({
    "acme/private": {
      token: "hf_secret",
      revisions: { main: { "data/train-00000-of-00001.parquet": parquet([row(7)]) } },
    },
  });
  await assert.rejects(
    loadHubDataset("acme/missing", { hubUrl: hub.url }),
    /"acme\/missing" was not found/,
  );
  await assert.rejects(
    loadHubDataset("acme/private", { hubUrl: hub.url }),
    /refused access \(HTTP 401\)/,
  );
  await assert.rejects(
    loadHubDataset("acme/private", { hubUrl: hub.url, accessToken: "x" }),
    /must start with "hf_"/,
  );
  const ds = await loadHubDataset("acme/private", { hubUrl: hub.url, accessToken: "hf_secret" });
  assert.deepEqual(ds.toList(), [row(7)]);
  await assert.rejects(
    loadHubDataset("not a repo!", { hubUrl: hub.url }),
    /Invalid Hugging Face dataset id/,
  );
});

Deno.test("loadHubDataset() with cacheDir downloads each file once", async () => {
  const cacheDir = await Deno.makeTempDir();
  try {
    await using hub = new FakeHub({
      "acme/qa": {
        revisions: { main: { "data/train-00000-of-00001.parquet": parquet([row(3)]) } },
      },
    });
    const first = await loadHubDataset("acme/qa", { hubUrl: hub.url, cacheDir });
    const downloads = () => hub.requests.filter((r) => r.includes("/resolve/")).length;
    const before = downloads();
    const second = await loadHubDataset("acme/qa", { hubUrl: hub.url, cacheDir });
    assert.ok(before > 0);
    assert.equal(downloads(), before);
    assert.deepEqual(second.toList(), first.toList());
    const blobs = [...Deno.readDirSync(join(cacheDir, "datasets", "acme", "qa", "blobs"))];
    assert.equal(blobs.length, 1);
  } finally {
    await Deno.remove(cacheDir, { recursive: true });
  }
});
