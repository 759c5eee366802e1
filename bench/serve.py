"""Local server figures: load time cold vs cached, HTTP throughput by batch size, re-encode drift.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.serve [--quick]

Everything runs in one temp cache, so "cold" really de-quantises the GGUF. Throughput goes
through `draftgate serve` in a subprocess over real HTTP (128 new tokens per request, T=0.7);
the baseline is the same model's HF `generate()` at batch 1 in this process. Re-encode drift:
of 64 sampled responses, how many give other ids when their decoded text is encoded again.
Writes bench/results/serve.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path


TOPICS = ["recursion", "hash tables", "TCP handshakes", "photosynthesis", "inflation", "black holes",
          "the French revolution", "vaccines", "compilers", "gradient descent", "plate tectonics",
          "the stock market", "git rebase", "SQL joins", "climate change", "public key cryptography"]
TASKS = ["reverses a linked list", "parses a CSV line", "checks if a string is a palindrome",
         "merges two sorted lists", "computes fibonacci numbers", "counts word frequencies",
         "finds the median of a list", "validates an email address", "flattens a nested list",
         "implements binary search", "converts Celsius to Fahrenheit", "removes duplicates from a list",
         "reads a JSON file", "computes a factorial", "sorts a dict by value", "rotates a matrix"]


def prompts() -> list[list[dict]]:
    chat = [f"Explain {t} to a beginner." for t in TOPICS] + [f"Write a short story about {t}." for t in TOPICS]
    code = [f"Write a Python function that {t}." for t in TASKS] + [f"Write a JavaScript function that {t}."
                                                                  for t in TASKS]
    return [[{"role": "user", "content": c}] for c in chat + code]     # 64 prompts


async def _fire(url: str, bodies: list[dict]) -> tuple[list[dict], float]:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        responses = await asyncio.gather(*(client.post(f"{url}/chat/completions", json=b) for b in bodies))
        wall = time.perf_counter() - start
    for r in responses:
        r.raise_for_status()
    return [r.json() for r in responses], wall


def body(messages: list[dict], seed: int, max_tokens: int) -> dict:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed,
            "return_token_ids": True}


def hf_generate_tok_s(lm, messages: list[dict], max_tokens: int) -> float:
    import torch

    ids = torch.tensor([lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]])
    torch.manual_seed(0)
    start = time.perf_counter()
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.7, top_p=1.0,
                            top_k=0, max_new_tokens=max_tokens, pad_token_id=lm.tokenizer.pad_token_id)
    return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 16 drift rows")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve.json"))
    args = parser.parse_args(argv)
    max_tokens, drift_rows = (32, 16) if args.quick else (128, 64)

    from draftgate.config import ServeParams
    from draftgate.io import write_json
    from draftgate.serve.process import running
    from draftgate.serve.model import load

    # Shared machines skew every figure here: record how busy it was.
    results: dict = {"max_tokens": max_tokens, "temperature": 0.7, "cpu_count": os.cpu_count(),
                     "loadavg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="draftgate-bench-") as cache:
        cold = load("auto", cache_root=Path(cache))
        cached = load("auto", cache_root=Path(cache))
        results["load_s"] = {"cold_gguf": round(cold.load_s, 2), "cached": round(cached.load_s, 2)}
        print(f"load: cold (GGUF) {cold.load_s:.1f} s, cached {cached.load_s:.2f} s", flush=True)
        baseline = hf_generate_tok_s(cached, prompts()[0], max_tokens)
        results["hf_generate_batch1_tok_s"] = round(baseline, 1)
        print(f"baseline HF generate() batch 1: {baseline:.1f} tok/s", flush=True)
        tokenizer = cached.tokenizer
        del cold

        os.environ["DRAFTGATE_CACHE"] = cache
        with running(ServeParams(max_batch=16, batch_wait_ms=20)) as url:
            asyncio.run(_fire(url, [body(prompts()[0], 0, 4)]))     # warm-up
            results["http_tok_s"] = {}
            for batch in (1, 8, 16):
                got, wall = asyncio.run(_fire(url, [body(m, i, max_tokens) for i, m in enumerate(prompts()[:batch])]))
                tokens = sum(r["usage"]["completion_tokens"] for r in got)
                results["http_tok_s"][str(batch)] = round(tokens / wall, 1)
                print(f"HTTP batch {batch:>2}: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s "
                      f"({tokens / wall / baseline:.2f}x HF generate batch 1)", flush=True)
            got, _ = asyncio.run(_fire(url, [body(m, 1000 + i, max_tokens) for i, m in enumerate(prompts()[:drift_rows])]))
            import httpx

            results["health"] = httpx.get(url.removesuffix("/v1") + "/health").json()

    differ, not_text_equal = 0, 0
    for r in got:
        choice = r["choices"][0]
        ids = choice["token_ids"][:-1] if choice["finish_reason"] == "stop" else choice["token_ids"]
        again = tokenizer.encode(choice["message"]["content"], add_special_tokens=False)
        if again != ids:
            differ += 1
            not_text_equal += tokenizer.decode(again) != tokenizer.decode(ids)
    results["reencode"] = {"rows": len(got), "differ": differ, "differ_text_too": not_text_equal}
    print(f"re-encode: {differ}/{len(got)} sampled rows give other ids than generated "
          f"({not_text_equal} of them decode to other text)", flush=True)
    results["loadavg_end"] = os.getloadavg()[0]
    write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
