#!/usr/bin/env python3
"""A trainer's side of a vf env server, over the ZeroMQ + msgpack wire that verifiers and
prime-rl speak. Standard library plus Debian's python3-zmq and python3-msgpack:

    apt-get install python3-zmq python3-msgpack
    vf serve file-sum --zmq tcp://127.0.0.1:5000 --env.agent.runtime.type docker &
    /usr/bin/python3 examples/zmq_trainer.py --address tcp://127.0.0.1:5000 \
        --base-url http://127.0.0.1:8000/v1 --model my-policy \
        --task-data '[{"prompt": "Sum the integers in /app/input.txt ...", "numbers": [1, 2, 3]}]'

The orchestrator owns the taskset: it sends each task's data (`task_data`) together with
the endpoint of its own inference server (`client`), the policy's name (`model`) and
sampling settings, and gets back the episode: every trace with its rewards, messages and
(when recorded) token data. One DEALER socket carries every request; replies come back in
any order and are matched to their request by `request_id` (32 hex digits).

Frames: request `[request_id, method, msgpack(payload)]`. Replies, on the current wire
(`vf serve --wire 2026-09`, the default; verifiers' serve since September 2026), are
`[request_id, kind, msgpack(data)]`: kind `delta` while a run's episode grows (each applied
to that run's assembly below) and `reply` once, last. A run's reply is `{success, error,
head, traces}`: `head` the episode without its traces (`id`, `env`, `task`, `group`, `run`,
`ok`, `errors`), `traces` each trace's `{id, nodes, calls}`, checked against the assembly.
A delta's `routing_repairs` (node index → the corrected last row of the node's mixture-of-
experts `routed_experts`) is applied as upstream's client does; vf servers record no routing
and never send one. On the earlier wire
(`--wire 2026-08`, pass `--wire 2026-08` here too) a reply is `[request_id,
msgpack(response)]`, a run's `{success, error, episode}` holding the whole episode: the
same head with its traces. Methods: `health`, `info` (current wire), `run`,
`cancel`. A reply with `success: false` carries `error: "<Type>: <message>"`.
"""

import argparse
import array
import asyncio
import json
import sys
import uuid

import msgpack
import zmq
import zmq.asyncio


class EnvServerError(RuntimeError):
    """The server replied `success: false`."""


LISTS = (
    "nodes",
    "calls",
    "payload",
    "errors",
    "extra_usage",
    "request_rewrites",
    "response_rewrites",
)
# numpy dtypes of routing arrays, as the `array` module's type codes
ARRAY_CODES = {"uint8": "B", "uint16": "H", "uint32": "I", "int8": "b", "int16": "h", "int32": "i"}


def replace_last_row(current: dict, row: dict) -> dict:
    """A packed array (`{__nd__, dtype, shape, data}`) with its last row replaced by `row`,
    widened to the larger integer type when the repair needs it, as numpy concatenates."""
    width = 1
    for dim in current["shape"][1:]:
        width *= dim
    old = array.array(ARRAY_CODES[current["dtype"]], current["data"])
    new = array.array(ARRAY_CODES[row["dtype"]], row["data"])
    dtype = row["dtype"] if new.itemsize > old.itemsize else current["dtype"]
    out = array.array(ARRAY_CODES[dtype], list(old[:len(old) - width]) + list(new))
    return {"__nd__": True, "dtype": dtype, "data": out.tobytes(),
            "shape": [current["shape"][0] - 1 + row["shape"][0], *current["shape"][1:]]}


class Assembly:
    """One run's traces as its deltas arrive (upstream's `Trace`, plus a `pending` preview)."""

    def __init__(self) -> None:
        self.traces: dict[str, dict] = {}

    def apply(self, delta: dict) -> None:
        trace_id = delta["trace"]
        if delta.get("discard"):
            self.traces.pop(trace_id, None)
            return
        if trace_id not in self.traces:
            self.traces[trace_id] = {**delta["open"], **{f: [] for f in LISTS}, "pending": []}
        trace = self.traces[trace_id]
        for index, links in (delta.get("links") or {}).items():
            trace["nodes"][int(index)].setdefault("semantic_parents", []).extend(links)
        for index, row in (delta.get("routing_repairs") or {}).items():
            node = trace["nodes"][int(index)]
            node["routed_experts"] = replace_last_row(node["routed_experts"], row)
        # nodes are copied: later links and repairs never change a delta the caller holds
        trace["nodes"].extend({**node, "semantic_parents": list(node.get("semantic_parents") or [])}
                              for node in delta.get("nodes") or [])
        for field in LISTS[1:]:
            trace[field].extend(delta.get(field) or [])
        trace.update(delta.get("set") or {})
        if "nodes" in delta:
            trace["pending"] = []
        if "pending" in delta:
            trace["pending"] = delta["pending"]

    def finish(self, reply: dict) -> dict:
        traces = []
        for summary in reply["traces"]:
            trace = {k: v for k, v in self.traces[summary["id"]].items() if k != "pending"}
            if len(trace["nodes"]) != summary["nodes"] or len(trace["calls"]) != summary["calls"]:
                raise EnvServerError(f"trace {summary['id']} assembled {len(trace['nodes'])} "
                                     f"nodes / {len(trace['calls'])} calls, the server says "
                                     f"{summary['nodes']} / {summary['calls']}")
            traces.append(trace)
        return {**reply["head"], "traces": traces}


class EnvClient:
    """One DEALER socket and one receive loop that resolves each request's future."""

    def __init__(self, address: str = "tcp://127.0.0.1:5000", wire: str = "2026-09") -> None:
        self.address = address
        self.current = wire == "2026-09"
        self.assemblies: dict[str, Assembly] = {}
        self.ctx = zmq.asyncio.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.connect(address)
        self.pending: dict[str, asyncio.Future] = {}
        self.receiver: asyncio.Task | None = None

    async def _receive(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            if len(frames) != (3 if self.current else 2):
                continue  # not this wire's form
            request_id, data = frames[0], frames[-1]
            if self.current and frames[1] == b"delta":
                assembly = self.assemblies.get(request_id.decode())
                if assembly is not None:
                    assembly.apply(msgpack.unpackb(data, raw=False, strict_map_key=False))
                continue
            future = self.pending.pop(request_id.decode(), None)
            if future is not None and not future.done():
                future.set_result(msgpack.unpackb(data, raw=False))

    async def request(self, method: str, payload: dict, timeout: float | None = None,
                      request_id: str | None = None) -> dict:
        """Send one request and wait for its reply (whatever its `success`)."""
        if self.receiver is None:
            self.receiver = asyncio.create_task(self._receive())
        request_id = request_id or uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        await self.socket.send_multipart(
            [request_id.encode(), method.encode(), msgpack.packb(payload, use_bin_type=True)]
        )
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self.pending.pop(request_id, None)

    async def health(self, timeout: float = 2.0) -> bool:
        try:
            return (await self.request("health", {}, timeout=timeout)).get("success") is True
        except asyncio.TimeoutError:
            return False

    async def wait_for_server(self, timeout: float = 120.0, interval: float = 1.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if await self.health(timeout=min(interval, 2.0)):
                return
            await asyncio.sleep(interval)
        raise TimeoutError(f"env server at {self.address} did not answer health in {timeout}s")

    async def run(self, task_data: dict, client: dict, model: str, sampling: dict,
                  request_id: str | None = None) -> dict:
        """Run one episode; return it. Cancelling this coroutine cancels the run."""
        request_id = request_id or uuid.uuid4().hex
        payload = {"task_data": task_data, "client": client, "model": model, "sampling": sampling}
        assembly = self.assemblies[request_id] = Assembly()
        try:
            reply = await self.request("run", payload, request_id=request_id)
        except asyncio.CancelledError:
            await self.cancel(request_id)
            raise
        finally:
            self.assemblies.pop(request_id, None)
        if not reply.get("success"):
            raise EnvServerError(reply.get("error") or "env server request failed")
        return assembly.finish(reply) if self.current else reply["episode"]

    async def cancel(self, request_id: str) -> bool:
        reply = await self.request("cancel", {"request_id": request_id}, timeout=10.0)
        return bool(reply.get("cancelled"))

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.cancel()
        self.socket.close()
        self.ctx.term()


def rewards_of(episode: dict) -> list:
    """Each trace's rewards, upstream's `{name: {score, weight}}` on either wire (a name
    whose scoring did not run maps to None)."""
    return [trace.get("rewards") for trace in episode.get("traces", [])]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="tcp://127.0.0.1:5000")
    parser.add_argument("--base-url", required=True, help="the policy's inference endpoint")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-var", default=None,
                        help="a variable the server may read the key from (--allow-key-var)")
    parser.add_argument("--task-data", required=True,
                        help="a JSON list of task data, or @file.json")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rollouts", type=int, default=1, help="episodes per task")
    parser.add_argument("--wire", default="2026-09", choices=["2026-09", "2026-08"],
                        help="the form the server speaks (vf serve --wire)")
    args = parser.parse_args()
    text = args.task_data
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    tasks = json.loads(text)
    client = {"base_url": args.base_url}
    if args.api_key_var:
        client["api_key_var"] = args.api_key_var
    env = EnvClient(args.address, args.wire)
    try:
        await env.wait_for_server()
        runs = [
            env.run(data, client, args.model, {"temperature": args.temperature})
            for data in tasks for _ in range(args.rollouts)
        ]
        failed = 0
        for done in asyncio.as_completed(runs):
            try:
                episode = await done
            except EnvServerError as error:
                failed += 1
                print(json.dumps({"error": str(error)}))
                continue
            print(json.dumps({"task": episode["task"]["key"], "ok": episode["ok"],
                              "rewards": rewards_of(episode)}))
        return 1 if failed else 0
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
