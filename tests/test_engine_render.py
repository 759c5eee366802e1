"""contract.engine's faults without an engine: a vLLM that answers 403 on its render endpoint (a
server started without --enable-scale-out: a loopback stand-in that answers as vLLM 0.32 does;
the real endpoint is tested in tests/test_engine_vllm.py) stops the contract stage naming the
flag, and a template gate told to expect the engine's rendering refuses a contract.json without it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from draftgate.engine.launch import EngineError
from draftgate.engine.render import RENDER_PATH, RenderServer, render_all

MODEL = "smollm2-135m-instruct"
# vLLM 0.32's answer on a scale-out route of a server without the flag (scale_out/factories.py).
DISABLED = {"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
                                 "enable them.", "type": "PermissionDeniedError", "param": None, "code": 403}}


class NoScaleOut(BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer(200, {"data": [{"id": MODEL, "root": "/models/x"}]} if self.path == "/v1/models"
                     else {"version": "0.32.0"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(403 if self.path == RENDER_PATH else 404, DISABLED)

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def no_scale_out():
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoScaleOut)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_scale_out_is_refused_with_the_flag_to_restart_it_with(no_scale_out):
    with pytest.raises(EngineError, match=r"answered 403 .*only with --enable-scale-out; restart the server at "):
        render_all(RenderServer(no_scale_out, MODEL, {}), [([{"role": "user", "content": "hi"}], None, {})])


def test_the_contract_stage_stops_with_no_verdict_naming_the_flag(no_scale_out, tmp_path, capsys):
    from stages import contract

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["contract"]["engine"] = "vllm"
    params["generate"].update(backend="vllm", base_url=f"{no_scale_out}/v1", model=MODEL)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert contract.main(["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "c.json")]) == 2
    assert "--enable-scale-out" in capsys.readouterr().err and not (tmp_path / "c.json").exists()


def test_a_gate_expecting_the_engines_rendering_refuses_a_contract_without_it(tmp_path):
    from draftgate.checks.template import compute
    from draftgate.gates.suite import GateError

    (tmp_path / "contract.json").write_text(json.dumps({"template_contract": {"engine": None},
                                                        "template_probes": []}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"contract": {"engine": "vllm"}}))
    with pytest.raises(GateError, match=r"contract.engine: vllm, but .* holds no engine rendering .*rerun the contract"):
        compute({"template": str(tmp_path / "contract.json")}, str(tmp_path / "params.yaml"))
