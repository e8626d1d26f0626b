"""How long ``read_conversations`` takes on a LLaMA-Factory sharegpt file written as one JSON array and as JSON Lines.

    python benchmarks/sft_read.py                      # 50,000 records
    python benchmarks/sft_read.py --records 5000 20000 --repeat 3

Each record is a tool-using conversation as LLaMA-Factory's sharegpt format holds it (system, tools as a JSON string,
human / function_call / observation / gpt turns; ~1 KB). Figures: one line per file, the best of ``--repeat`` reads,
wall and CPU seconds. Measured figures and the command: the data helper's closing notes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ctu.episode.data.sft import read_conversations

TOOLS = json.dumps([{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by its id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}])


def record(n: int) -> dict:
    order = f"#W{n:07d}"
    return {"system": "You are a customer service agent for an online store. Be brief and accurate.", "tools": TOOLS,
            "conversations": [
                {"from": "human", "value": f"Hi, where is my order {order}? It was due last week."},
                {"from": "function_call", "value": json.dumps({"name": "get_order", "arguments": {"order_id": order}})},
                {"from": "observation", "value": json.dumps({"order_id": order, "status": "shipped",
                                                             "items": ["lamp", "kettle"], "eta": "2024-05-02"})},
                {"from": "gpt", "value": f"Order {order} has shipped (a lamp and a kettle) and should arrive on "
                                         "May 2nd. Anything else?"},
                {"from": "human", "value": "No, thanks."},
                {"from": "gpt", "value": "You're welcome, goodbye!"}]}


def best_read(path: Path, repeat: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, conversations) of the fastest of ``repeat`` reads."""
    best = (float("inf"), float("inf"), 0)
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        count = len(read_conversations(path))
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu, count))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, nargs="+", default=[50_000])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for n in args.records:
            records = [record(i) for i in range(n)]
            files = {"JSON array": Path(folder) / f"{n}.json", "JSON Lines": Path(folder) / f"{n}.jsonl"}
            files["JSON array"].write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
            files["JSON Lines"].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                           encoding="utf-8")
            for kind, path in files.items():
                wall, cpu, count = best_read(path, args.repeat)
                print(f"{n:>7} records  {kind:<10}  {path.stat().st_size / 2**20:6.1f} MiB  {wall:7.2f} s wall  "
                      f"{cpu:7.2f} s CPU  {count / wall:9.0f} records/s", flush=True)


if __name__ == "__main__":
    main()
