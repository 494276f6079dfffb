/**
 * Prime API stand-in (Prime's API is unreachable from CI): a loopback HTTP server that
 * serves the endpoints of Prime Intellect's sandbox API the prime runtime uses, shaped as
 * Prime's API reference documents them (docs.primeintellect.ai, "Sandbox"):
 *
 * - `POST   /api/v1/sandbox`                       create (201, camelCase sandbox)
 * - `GET    /api/v1/sandbox/{id}`                  status: PENDING, PROVISIONING, RUNNING, ...
 * - `GET    /api/v1/sandbox?labels=..&page=..`     list: `{sandboxes, total, page, perPage, hasNext}`
 * - `DELETE /api/v1/sandbox/{id}`                  delete (404 once gone)
 * - `POST   /api/v1/sandbox/{id}/ssh-session`      `{session_id, host, port, gateway_url, user_ns, job_id, token, ...}`
 * - `POST   {gateway_url}/{user_ns}/{job_id}/authorize`  authorizes a public key for the session
 *
 * Every `/api/v1` call needs `Authorization: Bearer <apiKey>` (401 otherwise). A sandbox
 * answers PENDING for `pendingPolls` polls, PROVISIONING once, then RUNNING, and its SSH
 * session points at a real sshd test host, where the session id becomes a login.
 * @module
 */

import type { SshdHost } from "./_sshd_hosts.ts";

/** A request the stand-in received. */
export interface StandInRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  body: unknown;
  authorization: string | null;
}

/** A sandbox the stand-in holds (Prime's camelCase response shape). */
export interface StandInSandbox {
  id: string;
  name: string;
  dockerImage: string;
  startCommand: string | null;
  cpuCores: number;
  memoryGB: number;
  diskSizeGB: number;
  diskMountPath: string;
  gpuCount: number;
  gpuType: string | null;
  vm: boolean;
  status: string;
  timeoutMinutes: number;
  environmentVars: Record<string, string>;
  labels: string[];
  createdAt: string;
  updatedAt: string;
  errorType: string | null;
  errorMessage: string | null;
  teamId: string | null;
  /** Stand-in bookkeeping, not part of the API's answer. */
  _polls: number;
  _deleted: boolean;
}

/** How the stand-in behaves. */
export interface StandInOptions {
  /** The key it accepts. */
  apiKey: string;
  /** Where SSH sessions point. */
  sshHost?: SshdHost;
  /** Polls answered PENDING before PROVISIONING and RUNNING; default 3. */
  pendingPolls?: number;
  /** Never leave PENDING (a readiness timeout). */
  neverReady?: boolean;
  /** Go to ERROR instead of RUNNING, with this error type. */
  failWith?: string;
  /** Answer this many DELETE requests with 503 before succeeding. */
  failDeletes?: number;
}

/** A running stand-in. */
export interface PrimeApiStandIn {
  /** Base URL to give as `apiBase`. */
  readonly url: string;
  readonly requests: StandInRequest[];
  readonly sandboxes: Map<string, StandInSandbox>;
  /** Sandboxes not deleted. */
  live(): StandInSandbox[];
  close(): Promise<void>;
}

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });

function hex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

function publicView(s: StandInSandbox): Record<string, unknown> {
  const { _polls: _p, _deleted: _d, ...rest } = s;
  return rest;
}

/** Starts the Prime API stand-in on 127.0.0.1 (a free port). */
export function startPrimeApiStandIn(options: StandInOptions): Promise<PrimeApiStandIn> {
  const requests: StandInRequest[] = [];
  const sandboxes = new Map<string, StandInSandbox>();
  const byIdempotencyKey = new Map<string, string>();
  const sessions = new Map<string, { sandboxId: string; token: string }>();
  let failDeletes = options.failDeletes ?? 0;
  let url = "";

  const handler = async (request: Request): Promise<Response> => {
    const { pathname, searchParams } = new URL(request.url);
    const text = await request.text();
    let body: unknown = undefined;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      return json(400, { detail: "Invalid JSON" });
    }
    const authorization = request.headers.get("authorization");
    requests.push({
      method: request.method,
      path: pathname,
      query: searchParams,
      body,
      authorization,
    });

    // The SSH gateway: authorizes a key for a session.
    const gateway = /^\/gateway\/([^/]+)\/([^/]+)\/authorize$/.exec(pathname);
    if (gateway && request.method === "POST") {
      const b = body as { session_id?: string; public_key?: string };
      const session = sessions.get(b?.session_id ?? "");
      if (!session || authorization !== `Bearer ${session.token}`) {
        return json(401, { detail: "Invalid session token" });
      }
      if (!b.public_key || !options.sshHost) return json(422, { detail: "public_key required" });
      await options.sshHost.authorize(b.session_id!, b.public_key);
      return json(200, { authorized: true });
    }

    if (!pathname.startsWith("/api/v1/")) return json(404, { detail: "Not Found" });
    if (authorization !== `Bearer ${options.apiKey}`) {
      return json(401, { detail: "Invalid or expired API key" });
    }

    if (pathname === "/api/v1/sandbox" && request.method === "POST") {
      const b = (body ?? {}) as Record<string, unknown>;
      const errors: Array<{ loc: string[]; msg: string }> = [];
      if (typeof b.name !== "string" || b.name.length < 1 || b.name.length > 100) {
        errors.push({ loc: ["body", "name"], msg: "String should have 1 to 100 characters" });
      }
      if (typeof b.docker_image !== "string" || !b.docker_image) {
        errors.push({ loc: ["body", "docker_image"], msg: "Field required" });
      }
      const ttl = b.timeout_minutes ?? 60;
      if (typeof ttl !== "number" || ttl < 1 || ttl > 1440) {
        errors.push({ loc: ["body", "timeout_minutes"], msg: "Input should be 1 to 1440" });
      }
      if (b.labels !== undefined && !Array.isArray(b.labels)) {
        errors.push({ loc: ["body", "labels"], msg: "Input should be a valid list" });
      }
      if (errors.length) return json(422, { detail: errors });
      const key = typeof b.idempotency_key === "string" ? b.idempotency_key : undefined;
      if (key && byIdempotencyKey.has(key)) {
        return json(201, publicView(sandboxes.get(byIdempotencyKey.get(key)!)!));
      }
      const now = new Date().toISOString();
      const sandbox: StandInSandbox = {
        id: `sbx${hex(8)}`,
        name: b.name as string,
        dockerImage: b.docker_image as string,
        startCommand: (b.start_command as string) ?? null,
        cpuCores: (b.cpu_cores as number) ?? 1,
        memoryGB: (b.memory_gb as number) ?? 2,
        diskSizeGB: (b.disk_size_gb as number) ?? 10,
        diskMountPath: "/",
        gpuCount: (b.gpu_count as number) ?? 0,
        gpuType: (b.gpu_type as string) ?? null,
        vm: (b.vm as boolean) ?? false,
        status: "PENDING",
        timeoutMinutes: ttl as number,
        environmentVars: (b.environment_vars as Record<string, string>) ?? {},
        labels: (b.labels as string[]) ?? [],
        createdAt: now,
        updatedAt: now,
        errorType: null,
        errorMessage: null,
        teamId: (b.team_id as string) ?? null,
        _polls: 0,
        _deleted: false,
      };
      sandboxes.set(sandbox.id, sandbox);
      if (key) byIdempotencyKey.set(key, sandbox.id);
      return json(201, publicView(sandbox));
    }

    if (pathname === "/api/v1/sandbox" && request.method === "GET") {
      const labels = searchParams.getAll("labels");
      const active = searchParams.get("is_active") === "true";
      const page = Number(searchParams.get("page") ?? 1);
      const perPage = Number(searchParams.get("per_page") ?? 50);
      const all = [...sandboxes.values()].filter((s) =>
        !s._deleted && labels.every((l) => s.labels.includes(l)) &&
        (!active || s.status !== "TERMINATED")
      );
      const slice = all.slice((page - 1) * perPage, page * perPage);
      return json(200, {
        sandboxes: slice.map(publicView),
        total: all.length,
        page,
        perPage,
        hasNext: page * perPage < all.length,
      });
    }

    const one = /^\/api\/v1\/sandbox\/([^/]+)$/.exec(pathname);
    if (one) {
      const sandbox = sandboxes.get(decodeURIComponent(one[1]));
      if (request.method === "DELETE" && failDeletes > 0) {
        failDeletes--;
        return json(503, { detail: "Service temporarily unavailable" });
      }
      if (!sandbox || sandbox._deleted) return json(404, { detail: "Sandbox not found" });
      if (request.method === "GET") {
        sandbox._polls++;
        const pending = options.pendingPolls ?? 3;
        if (options.neverReady || sandbox._polls <= pending) sandbox.status = "PENDING";
        else if (sandbox._polls === pending + 1) sandbox.status = "PROVISIONING";
        else if (options.failWith) {
          sandbox.status = "ERROR";
          sandbox.errorType = options.failWith;
          sandbox.errorMessage = "The stand-in was asked to fail this sandbox";
        } else sandbox.status = "RUNNING";
        sandbox.updatedAt = new Date().toISOString();
        return json(200, publicView(sandbox));
      }
      if (request.method === "DELETE") {
        sandbox._deleted = true;
        sandbox.status = "TERMINATED";
        return json(200, { message: "Sandbox deleted" });
      }
    }

    const ssh = /^\/api\/v1\/sandbox\/([^/]+)\/ssh-session$/.exec(pathname);
    if (ssh && request.method === "POST") {
      const sandbox = sandboxes.get(decodeURIComponent(ssh[1]));
      if (!sandbox || sandbox._deleted) return json(404, { detail: "Sandbox not found" });
      if (sandbox.status !== "RUNNING") return json(409, { detail: "Sandbox is not running" });
      if (!options.sshHost) return json(500, { detail: "The stand-in has no SSH host" });
      const ttl = Math.min(3600, Number((body as { ttl_seconds?: number })?.ttl_seconds ?? 900));
      const sessionId = `sess${hex(6)}`;
      const token = `tok${hex(12)}`;
      sessions.set(sessionId, { sandboxId: sandbox.id, token });
      const host = options.sshHost;
      return json(200, {
        session_id: sessionId,
        exposure_id: `exp${hex(6)}`,
        sandbox_id: sandbox.id,
        host: host.host,
        port: host.port,
        external_endpoint: `${host.host}:${host.port}`,
        expires_at: new Date(Date.now() + ttl * 1000).toISOString(),
        ttl_seconds: ttl,
        gateway_url: `${url}/gateway`,
        user_ns: "ns-standin",
        job_id: sandbox.id,
        token,
      });
    }
    return json(405, { detail: "Method Not Allowed" });
  };

  return new Promise((resolve) => {
    const server = Deno.serve({
      hostname: "127.0.0.1",
      port: 0,
      onListen: ({ port }) => {
        url = `http://127.0.0.1:${port}`;
        resolve({
          url,
          requests,
          sandboxes,
          live: () => [...sandboxes.values()].filter((s) => !s._deleted),
          close: () => server.shutdown(),
        });
      },
    }, handler);
  });
}
