"""Stand-in for vllm/entrypoints/serve/dev/rlhf/api_router.py at vLLM commit
6fbea1171830682c53ecb7d3ae67495fa799e62f, written from that file, on the standard library's HTTP
server instead of FastAPI:

- POST /init_weight_transfer_engine {"init_info": {...}} -> {"message": "Weight transfer initialized"}
- POST /start_weight_update (optional {"include_draft": bool}) -> {"message": "Weight update started"}
- POST /update_weights {"update_info": {...}} -> {"message": "Weights updated"}
- POST /finish_weight_update -> {"message": "Weight update finished"}
- GET /get_world_size -> {"world_size": n}

Invalid JSON, or a missing init_info / update_info, is 400 {"detail": ...}. Any other exception
goes to the app's exception handler, as vllm/entrypoints/serve/exception_handler/error_response.py
at 364f9de3760306147796cb9ac54493abfeacbe2a maps it: ValueError, TypeError, OverflowError -> 400
BadRequestError; NotImplementedError -> 501; anything else -> 500 InternalServerError; the body is
{"error": {"message", "type", "code", "param"}}.
"""
import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest


class HTTPException(Exception):
    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


def create_error_response(exc: Exception) -> tuple:
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        err_type, status = "BadRequestError", HTTPStatus.BAD_REQUEST
    elif isinstance(exc, NotImplementedError):
        err_type, status = "NotImplementedError", HTTPStatus.NOT_IMPLEMENTED
    else:
        err_type, status = "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR
    return status.value, {"error": {"message": str(exc), "type": err_type, "code": status.value, "param": None}}


def _json_body(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise HTTPException(400, "Invalid JSON format") from e


def init_weight_transfer_engine(engine, raw: bytes):
    init_info = _json_body(raw).get("init_info")
    if init_info is None:
        raise HTTPException(HTTPStatus.BAD_REQUEST.value, "Missing 'init_info' in request body")
    engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
    return {"message": "Weight transfer initialized"}


def start_weight_update(engine, raw: bytes):
    include_draft = _json_body(raw).get("include_draft", False) if raw else False
    engine.start_weight_update(include_draft=include_draft)
    return {"message": "Weight update started"}


def update_weights(engine, raw: bytes):
    update_info = _json_body(raw).get("update_info")
    if update_info is None:
        raise HTTPException(HTTPStatus.BAD_REQUEST.value, "Missing 'update_info' in request body")
    engine.update_weights(request=WeightTransferUpdateRequest(update_info=update_info))
    return {"message": "Weights updated"}


def finish_weight_update(engine, raw: bytes):
    engine.finish_weight_update()
    return {"message": "Weight update finished"}


POST = {"/init_weight_transfer_engine": init_weight_transfer_engine, "/start_weight_update": start_weight_update,
        "/update_weights": update_weights, "/finish_weight_update": finish_weight_update}


def serve(engine, world_size: int, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serves the routes for `engine` (an LLM) on a thread of its own; returns the server
    (``server_address``; ``shutdown()`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            route = POST.get(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if route is None:
                return self._answer(404, {"detail": "Not Found"})
            try:
                self._answer(200, route(engine, raw))
            except HTTPException as e:
                self._answer(e.status_code, {"detail": e.detail})
            except Exception as e:  # the app's exception handler
                self._answer(*create_error_response(e))

        def do_GET(self):
            if self.path.startswith("/get_world_size"):
                return self._answer(200, {"world_size": world_size})
            self._answer(404, {"detail": "Not Found"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
