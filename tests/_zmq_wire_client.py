#!/usr/bin/env python3
"""The trainer side of tests/zmq_serve_test.ts for the current wire (2026-09), written from
the protocol description alone (not from vf's clients): Debian's python3-zmq, python3-msgpack
and python3-jsonschema. A request is [request_id, method, msgpack(payload)]; every reply
frame is [request_id, kind, msgpack(data)], kind "delta" while a run grows and "reply" last.
It assembles the deltas, checks them against the reply's per-trace counts, validates the
reply's episode head (upstream's Episode without its traces) and each trace (upstream's
Trace) against their schemas, and checks each trace's token counts against its calls. Prints one JSON object the test asserts on.

Usage: _zmq_wire_client.py <address> <model base_url> <trace schema> <episode head schema>
"""

import asyncio
import json
import sys
import uuid

import jsonschema
import msgpack
import zmq
import zmq.asyncio

LISTS = (
    "nodes",
    "calls",
    "payload",
    "errors",
    "extra_usage",
    "request_rewrites",
    "response_rewrites",
)


class Wire:
    def __init__(self, address: str) -> None:
        self.socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(address)
        self.waiting: dict[str, asyncio.Queue] = {}
        self.dropped = 0
        self.loop = asyncio.get_running_loop().create_task(self.receive())

    async def receive(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            if len(frames) != 3:
                self.dropped += 1
                continue
            request_id, kind, data = frames
            queue = self.waiting.get(request_id.decode())
            if queue is not None:
                queue.put_nowait((kind.decode(), msgpack.unpackb(data, raw=False,
                                                                 strict_map_key=False)))

    async def send(self, frames: list[bytes], request_id: str) -> asyncio.Queue:
        queue = self.waiting[request_id] = asyncio.Queue()
        await self.socket.send_multipart(frames)
        return queue

    async def call(self, method: str, payload, request_id: str | None = None):
        """Returns (deltas, reply)."""
        request_id = request_id or uuid.uuid4().hex
        queue = await self.send([request_id.encode(), method.encode(), msgpack.packb(payload)],
                                request_id)
        deltas = []
        while True:
            kind, data = await queue.get()
            if kind == "reply":
                del self.waiting[request_id]
                return deltas, data
            deltas.append(data)


def assemble(deltas: list[dict], reply: dict) -> dict:
    traces: dict[str, dict] = {}
    for d in deltas:
        tid = d["trace"]
        if d.get("discard"):
            traces.pop(tid, None)
            continue
        if tid not in traces:
            traces[tid] = {**d["open"], **{f: [] for f in LISTS}, "pending": []}
        t = traces[tid]
        for index, links in (d.get("links") or {}).items():
            t["nodes"][int(index)].setdefault("semantic_parents", []).extend(links)
        for f in LISTS:
            t[f].extend(d.get(f) or [])
        t.update(d.get("set") or {})
        if "nodes" in d:
            t["pending"] = []
        if "pending" in d:
            t["pending"] = d["pending"]
    out = []
    for summary in reply["traces"]:
        t = {k: v for k, v in traces[summary["id"]].items() if k != "pending"}
        assert len(t["nodes"]) == summary["nodes"], (len(t["nodes"]), summary)
        assert len(t["calls"]) == summary["calls"], (len(t["calls"]), summary)
        out.append(t)
    return {**reply["head"], "traces": out}


def token_counts(trace: dict) -> dict:
    """A single-branch trace's token counts from its calls' usage, as upstream's Trace
    computes them: completions summed; the last call's whole sequence; each call's input
    beyond the previous call's whole sequence."""
    used = [c["usage"] for c in trace["calls"] if c.get("usage")]
    previous, fed = 0, 0
    for u in used:
        seen = u["prompt_tokens"] + (u.get("cached_input_tokens") or 0)
        fed += max(0, seen - previous)
        previous = seen + u["completion_tokens"]
    return {"num_input_tokens": fed,
            "num_output_tokens": sum(u["completion_tokens"] for u in used),
            "num_total_tokens": previous if used else 0}


async def main() -> None:
    address, base_url, schema_path, head_schema_path = sys.argv[1:5]
    with open(schema_path) as f:
        schema = json.load(f)
    with open(head_schema_path) as f:
        head_schema = json.load(f)
    wire = Wire(address)
    out: dict = {}
    client = {"base_url": base_url, "api_key_var": None, "headers": {}}
    sampling = {"temperature": 1.0, "top_p": None}

    def run_payload(data: dict) -> dict:
        return {"task_data": data, "client": client, "model": "m", "sampling": sampling}

    for _ in range(120):  # the server is bound already; two minutes at a load of 10
        try:
            _, out["health"] = await asyncio.wait_for(wire.call("health", {}), 1)
            break
        except asyncio.TimeoutError:
            pass
    _, out["info"] = await wire.call("info", {})

    # Runs with deltas, assembled and checked against the counts and the schema.
    results = await asyncio.gather(*(
        wire.call("run", run_payload({"prompt": f"Say hi ({i})", "expected": "hi", "idx": i}))
        for i in range(4)))
    out["runs"] = []
    for deltas, reply in results:
        assert reply["success"], reply
        assert set(reply) == {"success", "error", "head", "traces"}, sorted(reply)
        jsonschema.validate(reply["head"], head_schema)
        episode = assemble(deltas, reply)
        for trace in episode["traces"]:
            jsonschema.validate(trace, schema)
            assert trace["task"] == episode["task"], (trace["task"], episode["task"])
            counts = token_counts(trace)
            assert {k: trace[k] for k in counts} == counts, (counts, trace)
        out["runs"].append({"deltas": deltas, "reply": reply, "episode": episode})

    # A run whose model call hangs: a delta arrives while it is in flight, then cancel.
    run_id = uuid.uuid4().hex
    queue = await wire.send([run_id.encode(), b"run",
                             msgpack.packb(run_payload({"prompt": "HANG", "expected": "hi"}))],
                            run_id)
    kind, first = await asyncio.wait_for(queue.get(), 120)
    out["hang_first"] = {"kind": kind, "data": first}
    _, out["cancel"] = await wire.call("cancel", {"request_id": run_id})
    while True:
        kind, data = await queue.get()
        if kind == "reply":
            out["cancelled_run"] = data
            break

    # Garbage and oversized frames get error replies; the server keeps serving.
    rid = uuid.uuid4().hex
    q = await wire.send([rid.encode(), b"run", b"\xc1 not msgpack"], rid)
    out["not_msgpack"] = await q.get()
    rid = uuid.uuid4().hex
    q = await wire.send([rid.encode(), b"run"], rid)
    out["two_frames"] = await q.get()
    rid = uuid.uuid4().hex
    q = await wire.send([rid.encode(), b"run", b"\x00" * (65 * 1024 * 1024)], rid)
    out["oversized"] = await q.get()
    _, out["unknown_method"] = await wire.call("train", {})
    _, out["health_after"] = await wire.call("health", {})
    out["dropped"] = wire.dropped
    wire.loop.cancel()
    wire.socket.close()
    print(json.dumps(out))


asyncio.run(main())
