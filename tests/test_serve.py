"""The local server on the real SmolLM2 model, over real HTTP on loopback.

The model is converted from its GGUF once per session into a temp cache (the cold path, ~20 s),
then every test shares it; `running()` starts real `draftgate serve` subprocesses on that cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from aiohttp import web

from draftgate.config import ServeParams
from draftgate.serve import http, local, process, protocol
from draftgate.serve.model import END_TOKEN, SERVED_NAME, Sampling, generate_batch, gguf_path, load

HI = [{"role": "user", "content": "Say hello in one short sentence."}]
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("draftgate-cache")


@pytest.fixture(scope="session")
def lm(cache):
    return load("cpu", cache_root=cache)     # cold: GGUF -> safetensors in the temp cache


@pytest.fixture(scope="session")
def cached(lm, cache):
    return load("cpu", cache_root=cache)     # what every later process serves


@contextlib.contextmanager
def serving(lm):
    # The real aiohttp app on its own loop in a thread, so tests can call it with plain httpx.
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(http.build_app(lm, ServeParams(max_batch=8, batch_wait_ms=50)))
    sock = socket.create_server(("127.0.0.1", 0))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="session")
def server(cached):
    with serving(cached) as root:
        yield root


def chat(server: str, messages=HI, **fields) -> dict:
    response = httpx.post(f"{server}/v1/chat/completions", json={"model": SERVED_NAME, "messages": messages,
                                                                 **fields}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_cold_load_caches_safetensors_keyed_by_gguf_sha256_and_reloads_identical_logits(lm, cached, cache):
    import torch

    assert lm.source == "gguf"
    sha = hashlib.sha256(gguf_path().read_bytes()).hexdigest()
    assert lm.gguf_sha256 == sha
    [folder] = cache.glob("smollm2-135m-instruct-*")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["inputs"]["gguf_sha256"] == sha and "model.safetensors" in manifest["files"]
    assert cached.weights_fingerprint == lm.weights_fingerprint
    assert cached.source == "cache"
    prompt = lm.tokenizer.apply_chat_template(POEM, add_generation_prompt=True)["input_ids"]
    assert cached.tokenizer.apply_chat_template(POEM, add_generation_prompt=True)["input_ids"] == prompt
    assert cached.tokenizer.get_vocab() == lm.tokenizer.get_vocab()
    assert cached.tokenizer.chat_template == lm.tokenizer.chat_template
    with torch.inference_mode():
        assert torch.equal(lm.model(torch.tensor([prompt])).logits, cached.model(torch.tensor([prompt])).logits)


def test_end_token_is_resolved_by_name_and_round_trips(lm):
    [end] = lm.end_ids
    assert lm.tokenizer.decode([end]) == END_TOKEN
    assert lm.tokenizer.encode(END_TOKEN, add_special_tokens=False) == [end]
    assert end == 2   # the fact, checked against the real tokenizer


def test_token_bytes_agree_with_decode_for_every_whole_utf8_token(lm):
    checked = 0
    for tid, raw in enumerate(lm.token_bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue    # half a character: decode() would say U+FFFD, the bytes are the truth
        assert lm.tokenizer.decode([tid]) == text, tid
        checked += 1
    assert len(lm.token_bytes) == len(lm.tokenizer) and checked > 45_000


def test_a_seeded_row_is_unchanged_by_padding_and_by_rows_that_finish_first(lm):
    prompt = lambda m: lm.tokenizer.apply_chat_template(m, add_generation_prompt=True)["input_ids"]
    seeded = Sampling(max_tokens=12, temperature=0.8, top_p=0.9, seed=42)
    long = [{"role": "user", "content": "Explain, in detail and with an example, what a Python decorator is."}]
    alone = generate_batch(lm, [prompt(POEM)], [seeded])[0]
    batch = generate_batch(lm, [prompt(HI), prompt(POEM), prompt(long)],
                           [Sampling(max_tokens=3), seeded, Sampling(max_tokens=6, temperature=1.0, seed=7)])
    assert batch[1] == alone
    assert [len(g.steps) for g in batch] == [3, 12, 6] and batch[0].finish_reason == "length"


def test_models_lists_the_served_model(server):
    listed = httpx.get(f"{server}/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [SERVED_NAME]


def test_the_server_reports_the_identity_of_what_it_serves(server, cached, smollm2_tok):
    identity = process.served_identity(f"{server}/v1")
    assert identity == cached.identity
    assert identity["tokenizer"] == smollm2_tok.fingerprint          # the very tokenizer the pipeline loads
    assert identity["chat_template"] == hashlib.sha256(smollm2_tok.chat_template.encode()).hexdigest()
    assert len(identity["weights"]) == 64 and identity["device"] == "cpu"
    assert chat(server, max_tokens=1)["system_fingerprint"] == protocol.system_fingerprint(cached)


def test_completion_ids_decode_to_content_plus_end_token_and_usage_counts_them(server, lm):
    body = chat(server, max_tokens=64, temperature=0, return_token_ids=True)
    choice = body["choices"][0]
    assert body["provider"] == "local" and body["id"].startswith("chatcmpl-")
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]
    assert choice["message"]["tool_calls"] is None and choice["message"]["reasoning"] is None
    assert lm.tokenizer.decode(choice["token_ids"]) == choice["message"]["content"] + END_TOKEN
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])


def test_completion_ids_repeat_in_a_second_run_and_differ_between_prompts(cached):
    colour, fruit = [{"role": "user", "content": "Name a colour."}], [{"role": "user", "content": "Name a fruit."}]
    runs = []
    for _ in range(2):   # two server starts, as two runs of the generate stage
        with serving(cached) as root:
            runs.append([chat(root, m, max_tokens=2, seed=3)["id"] for m in (colour, fruit, colour)])
    assert runs[0] == runs[1] and all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in runs[0])
    assert len(set(runs[0])) == 3        # another prompt, and a repeat of one, are other generations


def test_a_completion_id_hashes_the_body_whatever_its_key_order_and_counts_repeats():
    first, second = protocol.CompletionIds(), protocol.CompletionIds()
    body = {"messages": HI, "seed": 1, "max_tokens": 4}
    gid = first.next(body)
    assert second.next(dict(reversed(body.items()))) == gid
    assert first.next(body) != gid                       # the same body again: its second generation
    assert second.next({**body, "seed": 2}) != gid


def test_prompt_token_ids_are_the_tokenizers_own_chat_template_ids(server, lm):
    messages = [{"role": "system", "content": "Be terse."}, *POEM]
    body = chat(server, messages, max_tokens=2, return_token_ids=True)
    assert body["prompt_token_ids"] == lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


def test_temperature_zero_is_deterministic(server):
    first, second = (chat(server, POEM, max_tokens=16, temperature=0, return_token_ids=True) for _ in range(2))
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_max_tokens_is_honoured_with_finish_reason_length(server, lm):
    body = chat(server, POEM, max_tokens=5, temperature=0.7, seed=1, return_token_ids=True)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    assert lm.tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]


def test_seeded_sample_gives_the_same_ids_alone_and_inside_a_concurrent_batch(server):
    seeded = dict(messages=POEM, max_tokens=16, temperature=0.9, top_p=0.95, seed=1234, return_token_ids=True)
    alone = chat(server, **seeded)["choices"][0]["token_ids"]
    before = httpx.get(f"{server}/health").json()["batch_sizes"]
    others = [dict(messages=[{"role": "user", "content": f"Count to {n}."}], max_tokens=12, temperature=0.7,
                   seed=n) for n in range(3, 8)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda f: chat(server, **f), [seeded, *others]))
    after = httpx.get(f"{server}/health").json()["batch_sizes"]
    assert results[0]["choices"][0]["token_ids"] == alone
    new_batches = {int(k): v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
    assert max(new_batches) >= 2, f"six concurrent requests were never batched: {new_batches}"
    assert sum(k * v for k, v in new_batches.items()) == 6


def test_different_seeds_sample_different_text(server):
    texts = {chat(server, POEM, max_tokens=6, temperature=1.0, seed=s)["choices"][0]["message"]["content"]
             for s in (1, 2, 3)}
    assert len(texts) > 1


def test_logprob_bytes_join_to_the_content_and_top_logprobs_are_sorted(server):
    body = chat(server, POEM, max_tokens=16, temperature=0.7, seed=5, logprobs=True, top_logprobs=3,
                return_token_ids=True)
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert bytes(b for e in entries for b in e["bytes"]).decode() == choice["message"]["content"]
    assert len(entries) == len(choice["token_ids"]) - (choice["finish_reason"] == "stop")
    for e in entries:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e["logprob"] <= tops[0] + 1e-6


def test_stream_carries_the_same_text_ids_and_usage_as_the_plain_response(server):
    fields = dict(messages=POEM, max_tokens=24, temperature=0.8, seed=9, return_token_ids=True)
    plain = chat(server, **fields)
    with httpx.stream("POST", f"{server}/v1/chat/completions",
                      json={**fields, "stream": True, "stream_options": {"include_usage": True}}, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["delta"].get("content", "") for c in choices) == plain["choices"][0]["message"]["content"]
    assert [i for c in choices for i in c.get("token_ids", [])] == plain["choices"][0]["token_ids"]
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    assert choices[-1]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == plain["usage"]


def test_tools_the_template_ignores_are_reported_not_silently_dropped(server):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with_tools = chat(server, HI, tools=tools, max_tokens=1, return_token_ids=True)
    without = chat(server, HI, max_tokens=1, return_token_ids=True)
    assert with_tools["prompt_token_ids"] == without["prompt_token_ids"]
    assert "tools" in with_tools["warnings"][0] and "warnings" not in without


@pytest.mark.parametrize(("fields", "status", "param"), [
    ({"messages": []}, 400, "messages"),
    ({"temperature": 3}, 400, "temperature"),
    ({"stop": ["\n"]}, 400, "stop"),
    ({"n": 2}, 400, "n"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 9000}, 400, "max_tokens"),
    ({"top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, 400, "messages[0].content"),
    ({"model": "gpt-4o"}, 404, "model"),
])
def test_bad_requests_get_an_openai_shaped_error_naming_the_field(server, fields, status, param):
    response = httpx.post(f"{server}/v1/chat/completions",
                          json={"model": SERVED_NAME, "messages": HI, **fields}, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["code"]


def test_a_body_that_is_not_json_and_an_unknown_route_get_json_errors(server):
    bad = httpx.post(f"{server}/v1/chat/completions", content=b"{nope", timeout=30)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    missing = httpx.get(f"{server}/v1/embeddings")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_running_starts_a_subprocess_server_and_stops_it_on_exit(cache, monkeypatch):
    monkeypatch.setenv("DRAFTGATE_CACHE", str(cache))
    with process.running(ServeParams(device="cpu", max_batch=4)) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        body = httpx.post(f"{url}/chat/completions", json={"messages": HI, "max_tokens": 4}, timeout=60).json()
        assert body["usage"]["completion_tokens"] >= 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=5)


def test_running_reports_a_dead_server_with_its_stderr():
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 1.*cannot listen on 256\.0\.0\.1"):
        with process.running(host="256.0.0.1"):
            pass


def test_cli_exits_2_on_a_missing_params_file_and_1_on_a_bad_host(tmp_path, capsys):
    assert local.main(["--port", "0", "--params", str(tmp_path / "params.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert local.main(["--host", "256.0.0.1", "--port", "0"]) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_the_server_tokenises_digits_one_by_one_as_the_real_smollm2_does(lm):
    # transformers' GGUF conversion alone would merge "2024" differently; the server must use the
    # model's real pre-tokenizer, or its truth ids disagree with everything downstream.
    ids = lm.tokenizer.encode("in  2024", add_special_tokens=False)
    assert [lm.tokenizer.decode([i]) for i in ids][-4:] == ["2", "0", "2", "4"]


def test_a_server_whose_stage_was_killed_stops_by_itself():
    """kill -9 of the stage runs no cleanup; the server notices it was orphaned and exits, rather
    than holding the CPU for the rest of the machine's life."""
    import subprocess
    import sys
    import time

    stage = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom draftgate.serve.process import running\n"
                               "with running() as url:\n    print(url, flush=True)\n    time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        url = stage.stdout.readline().strip()
        assert httpx.get(f"{url}/models", timeout=10).status_code == 200
    finally:
        stage.kill()
        stage.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/models", timeout=1)
        except httpx.TransportError:
            return
        time.sleep(0.2)
    pytest.fail(f"the server at {url} still answers 20 s after its stage was killed")


def test_the_server_scores_a_token_id_prompt_as_vllm_does_for_repair(server, lm):
    import torch

    from draftgate.repair.score import Sampling as Tempered
    from draftgate.repair.score import VllmScorer

    ids = lm.tokenizer.encode("The sea is calm tonight.", add_special_tokens=False)
    with torch.inference_mode():
        raw = torch.log_softmax(lm.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    want = [float(raw[i - 1, t]) for i, t in enumerate(ids) if i >= 1]
    # The repair backend's own request and checks (every entry names the id sent at its position).
    assert VllmScorer(server, SERVED_NAME, Tempered(1.0)).score(ids, 1).logprobs == pytest.approx(want, abs=1e-4)
    bad = httpx.post(f"{server}/v1/completions", json={"prompt": ids, "prompt_logprobs": 99, "max_tokens": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_logprobs"
