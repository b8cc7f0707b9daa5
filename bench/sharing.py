"""The paper's Figure 15 on a real model: KV blocks saved by sharing, SmolLM2-135M-Instruct answering instructions.

    python bench/sharing.py --model smollm2-135m-instruct            # 32 instructions, answers up to 32 tokens
    python bench/sharing.py --model smollm2-135m-instruct --quick    # 8 instructions, up to 32 tokens

Prompts: the first --prompts lines of bench/data/instructions.txt (short Alpaca-like instructions written for this
project), each through the model's chat template (its default system prompt, then the instruction). The answers
are the model's: parallel sampling (n = 2, 4, 6, temperature 1.0, seeded) and beam search (width 2, 4, 6), every
output ending at the model's EOS or at --max-tokens. All requests are submitted at once to a pool roomy enough
that nothing is preempted (`preemptions` says so). saving_pct is `core.engine.sharing`'s measure: the mean over
steps of 1 - blocks in use / blocks the same live sequences would hold without sharing.

Beside each row: the paper's Figure 15 (OPT-13B on Alpaca) and the same measurement on the tiny random Llama
(`core.engine.sharing.measure_sharing`: Alpaca prompt and output lengths, random tokens, EOS ignored; output
lengths capped at --random-max-output; --random-requests 0 leaves it out). Prints one JSON object. --modes parallel /
--modes beam measure one mode only, so the two can run in separate processes on a machine with idle cores.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.common import cdiv
from core.device import device_label
from core.engine import Engine
from core.engine.fetch import MODELS, fetch_model
from core.engine.sharing import measure_prompt_sharing, measure_sharing

INSTRUCTIONS = Path(__file__).resolve().parent / "data" / "instructions.txt"
WIDTHS = (2, 4, 6)
BLOCK_SIZE = 16
MODES = {
    "both": ("parallel sampling", "beam search"),
    "parallel": ("parallel sampling",),
    "beam": ("beam search",),
}
PROMPT_BOUND = 64  # tokens of a rendered instruction at most (the pool is sized for it)


def read_instructions(count: int) -> list[str]:
    """The first `count` non-empty lines of bench/data/instructions.txt."""
    lines = [line.strip() for line in INSTRUCTIONS.read_text().splitlines() if line.strip()]
    if count > len(lines):
        raise SystemExit(f"--prompts {count}: {INSTRUCTIONS.name} holds {len(lines)} instructions")
    return lines[:count]


def real_model_rows(
    name: str, count: int, max_tokens: int, seed: int, modes: tuple[str, ...], widths: tuple[int, ...]
) -> tuple[list[dict], dict]:
    path = fetch_model(name)
    started = time.perf_counter()
    longest = PROMPT_BOUND + max_tokens
    blocks = count * max(WIDTHS) * (cdiv(longest, BLOCK_SIZE) + 1) + 16  # as measure_sharing sizes its pool
    engine = Engine.from_pretrained(path, num_blocks=blocks, block_size=BLOCK_SIZE, max_num_seqs=1024)
    prompts = [engine.chat_prompt([{"role": "user", "content": q}])[1] for q in read_instructions(count)]
    if max(len(p) for p in prompts) > PROMPT_BOUND:
        raise SystemExit(
            f"an instruction takes over {PROMPT_BOUND} tokens with the chat template: shorten it"
        )
    load_s = time.perf_counter() - started

    def report(fraction: float) -> None:  # a line per tenth of the work, for long CPU runs
        if int(fraction * 10) > getattr(report, "shown", -1):
            report.shown = int(fraction * 10)
            print(f"{fraction:.0%} after {time.perf_counter() - started:,.0f} s", file=sys.stderr, flush=True)

    with torch.inference_mode():
        frame = measure_prompt_sharing(
            engine,
            prompts,
            widths,
            [max_tokens] * count,
            seed=seed,
            ignore_eos=False,
            progress=report,
            modes=modes,
        )
    info = {
        "model_file": path.name,
        "prompts": count,
        "mean_prompt_tokens": round(sum(len(p) for p in prompts) / count, 1),
        "max_tokens": max_tokens,
        "num_blocks": blocks,
        "load_s": round(load_s, 1),
        "preemptions": int(engine.last_run.requests["preemptions"].sum()),
    }
    return frame.to_dict("records"), info


def merge(paths: list[str]) -> dict:
    """One result from outputs of separate processes (--modes / --widths) of the same workload: their rows in
    Figure 15's order, the random model's figures wherever one output has them, wall_s the longest."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    same = ("model", "prompts", "max_tokens", "seed", "block_size")
    if any(tuple(r[k] for k in same) != tuple(results[0][k] for k in same) for r in results):
        raise SystemExit(f"--merge: the outputs differ in {same}")
    random_pct = {
        (r["mode"], r["width"]): r["random_model_pct"]
        for x in results
        for r in x["rows"]
        if r["random_model_pct"] == r["random_model_pct"]
    }
    rows = sorted(
        (r for x in results for r in x["rows"]), key=lambda r: (r["mode"] != "parallel sampling", r["width"])
    )
    for row in rows:
        row["random_model_pct"] = random_pct.get((row["mode"], row["width"]), float("nan"))
    merged = dict(results[0])
    merged.update(
        rows=rows,
        preemptions=sum(r["preemptions"] for r in results),
        wall_s=max(r["wall_s"] for r in results),
        processes=len(results),
        random_model=next((r["random_model"] for r in results if r["random_model"]["requests"]), None),
    )
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sharing", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(MODELS))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--random-requests", type=int, default=8)
    parser.add_argument("--random-max-output", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--modes",
        choices=["both", "parallel", "beam"],
        default="both",
        help="only parallel sampling or only beam search (to run the two in separate processes)",
    )
    parser.add_argument("--widths", default="2,4,6", help="n / beam widths to run, e.g. 6 (one per process)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--merge", nargs="+", help="print one JSON object joining the rows of these outputs")
    parser.add_argument("--quick", action="store_true", help="8 prompts, 32 tokens, 4 random requests")
    args = parser.parse_args()
    if args.merge:
        print(json.dumps(merge(args.merge)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    widths = tuple(int(w) for w in args.widths.split(","))
    if args.quick:
        args.prompts, args.max_tokens, args.random_requests, args.random_max_output = 8, 32, 4, 64
    started = time.perf_counter()
    modes = MODES[args.modes]
    real, info = real_model_rows(args.model, args.prompts, args.max_tokens, args.seed, modes, widths)
    print(f"real model: {[round(r['saving_pct'], 1) for r in real]}", file=sys.stderr, flush=True)
    by_key = {}
    if args.random_requests > 0:
        random_model = measure_sharing(args.random_requests, WIDTHS, max_output_len=args.random_max_output)
        by_key = {(r["mode"], r["width"]): r for r in random_model.to_dict("records")}
    rows = []
    for row in real:
        other = by_key.get((row["mode"], row["width"]), {"saving_pct": float("nan")})
        rows.append(
            {
                "mode": row["mode"],
                "width": row["width"],
                "saving_pct": round(row["saving_pct"], 1),
                "paper_pct": row["paper_pct"],
                "random_model_pct": round(other["saving_pct"], 1),
                "mean_blocks_in_use": round(row["mean_blocks_in_use"], 1),
                "mean_blocks_without_sharing": round(row["mean_blocks_without_sharing"], 1),
                "steps": row["steps"],
                "output_tokens": row["output_tokens"],
            }
        )
    result = {
        "model": args.model,
        **info,
        "block_size": BLOCK_SIZE,
        "seed": args.seed,
        "random_model": {"requests": args.random_requests, "max_output_len": args.random_max_output},
        "widths": list(widths),
        "rows": rows,
        "device": device_label(),
        "torch_threads": torch.get_num_threads(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
