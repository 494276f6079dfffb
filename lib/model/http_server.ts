/**
 * One HTTP listener for vf's servers (the env server, the local model server) that works
 * under Deno (`Deno.serve`) and Bun (`Bun.serve`, in the compiled binary).
 * @module
 */

/** A fetch handler served by {@link serveHttp}. */
export type FetchHandler = (request: Request) => Response | Promise<Response>;

/** A listening HTTP server started by {@link serveHttp}. */
export interface HttpListener {
  port: number;
  /** Stops listening and closes connections; resolves when in-flight requests have ended. */
  close(): Promise<void>;
}

interface BunServer {
  port: number;
  stop(closeActiveConnections?: boolean): Promise<void> | void;
}
interface BunLike {
  serve(options: {
    port: number;
    hostname: string;
    idleTimeout?: number;
    tls?: { cert: string; key: string };
    fetch: FetchHandler;
  }): BunServer;
}

/** Serves `handler` with `Deno.serve` under Deno, else `Bun.serve`. */
export async function serveHttp(
  handler: FetchHandler,
  options: {
    port?: number;
    hostname?: string;
    /** Serve HTTPS with this certificate chain and key (PEM text). */
    tls?: { cert: string; key: string };
  } = {},
): Promise<HttpListener> {
  const port = options.port ?? 0;
  const hostname = options.hostname ?? "127.0.0.1";
  const deno = (globalThis as { Deno?: typeof Deno }).Deno;
  if (deno !== undefined && typeof deno.serve === "function") {
    const listening = Promise.withResolvers<Deno.NetAddr>();
    const server = deno.serve(
      { port, hostname, onListen: listening.resolve, ...(options.tls ?? {}) },
      handler,
    );
    const addr = await listening.promise;
    return { port: addr.port, close: () => server.shutdown() };
  }
  const bun = (globalThis as { Bun?: BunLike }).Bun;
  if (bun !== undefined && typeof bun.serve === "function") {
    // idleTimeout 0: a hanging reply must not be cut off by Bun's 10 s default.
    const server = bun.serve({
      port,
      hostname,
      idleTimeout: 0,
      fetch: handler,
      ...(options.tls ? { tls: options.tls } : {}),
    });
    const close = async () => {
      // Graceful first, like Deno's shutdown(): in-flight replies are sent, idle keep-alive
      // connections closed. Then force whatever is still open after a grace period.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const grace = new Promise<void>((resolve) => timer = setTimeout(resolve, 2_000));
      await Promise.race([server.stop(false), grace]);
      clearTimeout(timer);
      await server.stop(true);
    };
    return { port: server.port, close };
  }
  throw new Error("Cannot serve HTTP: neither Deno.serve nor Bun.serve is available");
}
