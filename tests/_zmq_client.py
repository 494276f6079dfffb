#!/usr/bin/env python3
"""The trainer side of tests/zmq_serve_test.ts: Debian's python3-zmq and python3-msgpack
driving `vf serve --zmq` through examples/zmq_trainer.py's DEALER client. Prints one JSON
object with every reply the test asserts on.

Usage: _zmq_client.py <address> <model base_url> <marker file>
"""

import asyncio
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from zmq_trainer import EnvClient  # noqa: E402


async def main() -> None:
    address, base_url, marker = sys.argv[1:4]
    env = EnvClient(address, "2026-08")
    out: dict = {}
    client = {"base_url": base_url, "api_key_var": "PRIME_API_KEY", "headers": {}}
    sampling = {"temperature": 1.0, "top_p": None, "max_tokens": None}
    try:
        await env.wait_for_server(timeout=60)
        out["health"] = await env.request("health", {})

        # 50 runs at once, replies matched by request_id.
        def run(i: int):
            data = {"prompt": f"Say hi ({i})", "expected": "hi", "idx": i, "name": None}
            return env.request("run", {"task_data": data, "client": client, "model": "m",
                                       "sampling": sampling})
        out["runs"] = await asyncio.gather(*(run(i) for i in range(50)))

        # Cancel a run in flight: its model call hangs until the cancel.
        run_id = uuid.uuid4().hex
        data = {"prompt": "HANG", "expected": "hi", "marker": marker}
        pending = asyncio.create_task(env.request(
            "run", {"task_data": data, "client": client, "model": "m", "sampling": sampling},
            request_id=run_id))
        while not os.path.exists(marker) or os.path.getsize(marker) == 0:
            await asyncio.sleep(0.05)  # setup has not reached the sandbox yet
        out["cancel"] = await env.request("cancel", {"request_id": run_id})
        out["cancelled_run"] = await pending
        out["cancel_again"] = await env.request("cancel", {"request_id": run_id})

        # A payload that is not msgpack, then the server still answers.
        rid = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        env.pending[rid] = future
        await env.socket.send_multipart([rid.encode(), b"run", b"\xc1 not msgpack"])
        out["malformed"] = await future
        out["malformed_map"] = await env.request("run", {"task_data": "x"})
        out["bad_task_data"] = await env.request("run", {
            "task_data": {"prompt": "Say hi", "expected": 5}, "client": client, "model": "m",
            "sampling": sampling})
        out["unknown_method"] = await env.request("train", {})
        out["health_after"] = await env.request("health", {})
    finally:
        env.close()
    print(json.dumps(out))


asyncio.run(main())
