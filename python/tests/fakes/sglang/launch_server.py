"""Stand-in for ``python -m sglang.launch_server``: parses the server's arguments and runs
launch_server (fakes/sglang/srt/entrypoints/http_server.py). ``--model`` names one of the tests'
models (python/tests/fake_models.py) instead of a model path; ``--seed`` its checkpoint."""
import argparse

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import ServerArgs

if __name__ == "__main__":
    import fake_models

    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--custom-weight-loader", type=str, nargs="*", default=None)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    make, checkpoint = fake_models.MODELS[a.model]
    launch_server(ServerArgs(tp_size=a.tp_size, custom_weight_loader=a.custom_weight_loader, host=a.host, port=a.port), make,
                  checkpoint(seed=a.seed))
