"""Drive `agentbox mcp` with the official MCP Python SDK, as an MCP client would.

    python client.py AGENTBOX_BINARY PROJECT [extra agentbox args...]

Prints one JSON object: what each step returned. The Rust test (tests/it/mcp.rs) judges it.
"""
import asyncio
import json
import os
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


# A request to the background server started below (the images have no curl).
FETCH = (
    "for i in $(seq 50); do python3 -c \"import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:8767/hello.py', timeout=5).status)\" && break; "
    "sleep 0.1; done"
)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def summary(result):
    return {"is_error": bool(result.isError), "text": text_of(result)}


async def main():
    binary, project, *extra = sys.argv[1:]
    # The test's environment whole (its data directory, AGENTBOX_CONFIG=""): the SDK passes
    # only a few variables (HOME, PATH, ...) unless told.
    params = StdioServerParameters(command=binary, args=["mcp", *extra, project], env=dict(os.environ))
    out = {}
    started = time.monotonic()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["server"] = init.serverInfo.name
            tools = await session.list_tools()
            out["tools"] = {
                t.name: {"read_only": bool(t.annotations and t.annotations.readOnlyHint)} for t in tools.tools
            }
            first = await session.call_tool("list_files", {})
            out["first_result_secs"] = time.monotonic() - started
            out["list_files"] = summary(first)
            calls = {
                "read_file": ("read_file", {"path": "hello.py"}),
                "search": ("search", {"pattern": "greet"}),
                "edit_file": ("edit_file", {"path": "hello.py", "old": "hello", "new": "howdy"}),
                "run_tests": ("run_tests", {}),
                "diff": ("diff", {}),
                "bash": ("bash", {"command": "id -u; cat /etc/hostname >/dev/null; echo in-sandbox"}),
                "outside": ("read_file", {"path": "../../../../etc/shadow"}),
                "unknown": ("no_such_tool", {}),
                "bad_args": ("read_file", {"path": 42}),
                "background": ("bash", {"command": "python3 -m http.server 8767 --bind 127.0.0.1", "background": True}),
                "fork_bomb": ("bash", {"command": "bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 5; echo survived"}),
                "after_bomb": ("bash", {"command": "echo still-here"}),
                "background_fetch": ("bash", {"command": FETCH}),
                "background_output": ("process_output", {"id": "p1"}),
            }
            for key, (name, args) in calls.items():
                if name in ("bash", "process_output") and "bash" not in out["tools"]:
                    continue
                out[key] = summary(await session.call_tool(name, args))
            # Two calls in flight at once: both answered, one after the other.
            if "bash" in out["tools"]:
                a, b = await asyncio.gather(
                    session.call_tool("bash", {"command": "sleep 2; echo first-done"}),
                    session.call_tool("bash", {"command": "echo second-done"}),
                )
                out["concurrent"] = [summary(a), summary(b)]
    print(json.dumps(out))


asyncio.run(main())
