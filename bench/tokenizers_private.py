"""Benchmark: tiktoken's public `encode_ordinary` (what draftgate uses) vs its private core.

    .venv/bin/python -m bench.tokenizers_private [--rows 4000] [--repeats 3]

draftgate/tokenizers/fast.py encodes ordinary text through tiktoken's public
`Encoding.encode_ordinary`, with a UTF-8 check of non-ASCII text so that a lone surrogate still
raises (the public wrapper would encode U+FFFD instead). The code it replaced called the private
`enc._core_bpe.encode_ordinary`, which raises by itself. STYLE.md principle 15: a private API is
worth keeping only if it pays; the bar is >= 30% on the reconstruct path. Two arms, in one
process on the same rows (real Qwen3 tokenizer, bench/reconstruct.py's synthetic responses):

- public:  the library as it is;
- private: `fast.strict_encoder` swapped for `enc._core_bpe.encode_ordinary` (the old code).

Measured twice: the reconstruct stage's whole job (reconstruct_files, Parquet in and out) and
the bare `encode_ordinary_batch` of the completion texts. The arms take turns, repeat after
repeat, on one thread (the thread choice is pinned so it cannot differ between arms); the best
of the repeats counts. Ids must be equal. Writes bench/results/tokenizers_private.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class OneThread:
    """ThreadChoice pinned to one thread: both arms encode the same way."""
    used: dict = {}

    def pick(self, cpus: int) -> int:
        return 1

    def record(self, threads: int, seconds: float, chars: int) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tokenizers_private.json")
    args = ap.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftgate import schema
    from draftgate.io import write_json
    from draftgate.reconstruct.core import Setup
    from draftgate.reconstruct.table import reconstruct_files
    from draftgate.templates import get_template
    from draftgate.tokenizers import fast, load_qwen3
    from bench.reconstruct import full_string, synthetic

    tok = load_qwen3()
    template = get_template("qwen3")
    setup = Setup(tok, template, {n: tok.token_id(n) for n in template.special_names}, True)
    prompts, responses = synthetic(args.rows, args.seed)
    texts = [full_string(r) for r in responses]
    work = Path(tempfile.mkdtemp(prefix="bench-tokenizers-"))
    pq.write_table(pa.Table.from_pylist([{f: r.get(f) for f in schema.responses().names} for r in responses],
                                        schema=schema.responses()), work / "responses.parquet")
    pq.write_table(pa.Table.from_pylist(prompts), work / "prompts.parquet")
    public = fast.strict_encoder
    arms = {"public": public, "private": lambda enc: enc._core_bpe.encode_ordinary}
    fast.ENCODE_THREADS = OneThread()
    tok.encode_ordinary_batch(["warm up", "é"])      # the tiktoken core and the NFC probe, before timing

    best = {(job, arm): float("inf") for job in ("reconstruct", "encode") for arm in arms}
    outputs: dict = {}
    for _ in range(args.repeats):
        for arm, encoder in arms.items():
            fast.strict_encoder = encoder
            for job in ("reconstruct", "encode"):
                gc.collect()
                t = time.perf_counter()
                if job == "reconstruct":
                    reconstruct_files(work / "responses.parquet", work / "prompts.parquet",
                                      work / f"tokens-{arm}.parquet", setup)
                else:
                    outputs[arm] = tok.encode_ordinary_batch(texts)
                best[(job, arm)] = min(best[(job, arm)], time.perf_counter() - t)
    fast.strict_encoder = public
    same_tokens = (work / "tokens-public.parquet").read_bytes() == (work / "tokens-private.parquet").read_bytes()
    same_ids = outputs["public"] == outputs["private"]
    shutil.rmtree(work)

    gain = {job: round(best[(job, "public")] / best[(job, "private")] - 1, 4) for job in ("reconstruct", "encode")}
    report = {
        "rows": args.rows, "repeats": args.repeats, "chars": sum(map(len, texts)),
        "seconds": {f"{job}_{arm}": round(v, 3) for (job, arm), v in best.items()},
        # How much faster the private core is than the public path (0.05 = 5%); the bar is 0.30.
        "private_speedup": gain, "private_worth_keeping": gain["reconstruct"] >= 0.30,
        "identical": {"tokens_parquet": same_tokens, "ids": same_ids},
        "machine": {"cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2)},
    }
    write_json(args.out, report)
    for (job, arm), v in best.items():
        print(f"{job:<12}{arm:<9}{v:>8.3f} s")
    print(f"private core faster by: reconstruct {gain['reconstruct']:+.1%}, bare encode {gain['encode']:+.1%} "
          f"(bar: +30% on reconstruct); identical tokens.parquet {same_tokens}, ids {same_ids}")
    print(f"wrote {args.out}")
    return 0 if same_tokens and same_ids else 1


if __name__ == "__main__":
    sys.exit(main())
