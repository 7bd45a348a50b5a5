"""Stand-in for python/sglang/srt/entrypoints/http_server.py at SGLang commit
9c0549b727fe222444495cea6b369697534d60f0, written from ``launch_server`` (the scheduler processes
started as the Engine starts them, then the HTTP server in this process; no Engine object for
another process to call) and the ``POST /update_weights_from_tensor`` route: the body is an
UpdateWeightsFromTensorReqInput (``serialized_named_tensors``: one base64 text per TP rank), the
answer {"success", "message"}, 200 when it succeeded, else 400. On the standard library's HTTP
server instead of FastAPI; a body that is not such a request is 400 (FastAPI: 422).

``python -m sglang.launch_server --tp-size N --port P --custom-weight-loader F --model llama``
(fakes/sglang/launch_server.py) runs it for the tests.
"""
import base64
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt.entrypoints.engine import _launch_subprocesses
from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput


def launch_server(server_args, make_model, checkpoint, env=None):
    tokenizer_manager, _ = _launch_subprocesses(server_args, make_model, checkpoint, env)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/update_weights_from_tensor":
                return self._answer(404, {"detail": "Not Found"})
            try:
                body = json.loads(raw)
                # Base64Bytes: the HTTP layer decodes each rank's text to the serializer's bytes.
                body["serialized_named_tensors"] = [base64.b64decode(t, validate=True) for t in body["serialized_named_tensors"]]
                obj = UpdateWeightsFromTensorReqInput(**body)
            except (ValueError, TypeError, KeyError) as e:
                return self._answer(400, {"error": {"message": str(e)}})
            success, message = tokenizer_manager.update_weights_from_tensor(obj)
            self._answer(200 if success else 400, {"success": success, "message": message})

        def do_GET(self):
            if self.path == "/health":
                return self._answer(200, {})
            self._answer(404, {"detail": "Not Found"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((server_args.host, server_args.port), Handler)
    print(f"listening on {server.server_address[0]}:{server.server_address[1]}", flush=True)
    server.serve_forever()
