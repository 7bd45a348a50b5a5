#!/usr/bin/env python3
"""A sharded trainer that publishes from its shards: N ranks (torch.distributed over gloo, on the
CPU) train the Llama-shaped model of tiny_llama.py, each rank holding only its part of every
weight, and each rank publishes only that part, as trainer shard i of N. The origin runs in this
launcher process (deltacast.Publisher with expect_shards=N); it merges the shards' slices into
versions of whole tensors under their checkpoint names. Relays and workers connect to --listen
and never see the sharding. No rank ever holds the whole model.

Two layouts, as large trainers hold a model:

  --layout fsdp      Every parameter is split into dim-0 ranges, as FSDP2's fully_shard holds it
                     (placement Shard(0): torch.chunk(param, N, dim=0), so the last ranks' ranges
                     may be shorter or empty). Each rank keeps its ranges of the FP32 master
                     weights and of AdamW's state, gathers a weight to compute with it, and
                     sums the gradients over the ranks, keeping its own range (FSDP's
                     all-gather and reduce-scatter). Each rank trains on its own batches.
  --layout megatron  Tensor parallel, as Megatron-LM splits it: q/k/v and gate/up are
                     column-parallel (dim-0 ranges), o_proj and down_proj row-parallel (dim-1
                     ranges), the embedding and lm_head vocab-parallel (dim-0 ranges), the norms
                     replicated. Row-parallel weights are exchanged between the ranks into dim-0
                     ranges to publish; rank 0 publishes the norms.

Each rank publishes its part as deltacast.Rows(local BF16 rows, first row, rows of the whole
tensor), numbering each version by its training step, so that a rank that restarts from a
checkpoint resumes at its step (docs/RUNTIME.md, "Trainer shards").

    python3 examples/train_shards.py --listen tcp://127.0.0.1:7100 --layout fsdp --ranks 4 --steps 10

--check runs a worker in the launcher and checks every merged version bit for bit against the
parts the ranks published (each rank writes its parts to a scratch directory for that).
"""

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn import functional as F

import deltacast
from tiny_llama import TinyLlama, batch

VOCAB, DIM, LAYERS, HEADS, FFN = 512, 128, 2, 4, 344
# Megatron's split of each weight: by output rows (column-parallel, vocab-parallel), by input
# columns (row-parallel), or none (replicated).
COLUMN, ROW, REPLICATED = "column", "row", "replicated"


def megatron_split(name: str) -> str:
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return ROW
    if name.endswith("norm.weight"):
        return REPLICATED
    return COLUMN  # q, k, v, gate, up; embed_tokens and lm_head by vocabulary


def row_range(rows: int, rank: int, world: int) -> tuple:
    """Rank's dim-0 range [start, end) of a tensor of `rows` rows: torch.chunk's split (FSDP2's Shard(0))."""
    per = -(-rows // world)
    return min(rows, rank * per), min(rows, (rank + 1) * per)


class GatherRows(torch.autograd.Function):
    """A weight whole from every rank's dim-0 range; backward sums its gradient over the ranks (each
    trained on its own batch) and keeps this rank's range, averaged."""

    @staticmethod
    def forward(ctx, local, rows, rank, world):
        per = -(-rows // world)
        padded = local.new_zeros((per,) + tuple(local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        ctx.range, ctx.world = row_range(rows, rank, world), world
        return torch.cat(parts)[:rows]

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        start, end = ctx.range
        return grad[start:end] / ctx.world, None, None, None


class CopyToRanks(torch.autograd.Function):
    """Megatron's f: the input of a column-parallel layer; its gradient is summed over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: the partial outputs of a row-parallel layer summed; the gradient passes through."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherLastDim(torch.autograd.Function):
    """Vocab-parallel logits made whole for the loss; backward keeps this rank's columns."""

    @staticmethod
    def forward(ctx, x, rank, world):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        ctx.cols, ctx.rank = x.shape[-1], rank
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.cols:(ctx.rank + 1) * ctx.cols], None, None


def rms(x, w):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def attention(q, k, v, heads):
    b, t, _ = q.shape
    q, k, v = (z.view(b, t, heads, -1).transpose(1, 2) for z in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)


def forward(p, tokens, layout, rank, world):
    """TinyLlama's forward over weights `p(name)`: whole (fsdp, gathered) or this rank's split (megatron)."""
    tp = layout == "megatron"
    if tp:  # vocab-parallel embedding: each rank looks up the tokens of its vocabulary range
        table = p("model.embed_tokens.weight")
        lo = rank * table.shape[0]
        mine = (tokens >= lo) & (tokens < lo + table.shape[0])
        x = SumOverRanks.apply(F.embedding((tokens - lo).clamp(0, table.shape[0] - 1), table) * mine.unsqueeze(-1))
    else:
        x = F.embedding(tokens, p("model.embed_tokens.weight"))
    into = CopyToRanks.apply if tp else (lambda h: h)
    out = SumOverRanks.apply if tp else (lambda h: h)
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        h = into(rms(x, p(pre + "input_layernorm.weight")))
        q, k, v = (F.linear(h, p(pre + f"self_attn.{n}.weight")) for n in ("q_proj", "k_proj", "v_proj"))
        x = x + out(F.linear(attention(q, k, v, HEADS // world if tp else HEADS), p(pre + "self_attn.o_proj.weight")))
        h = into(rms(x, p(pre + "post_attention_layernorm.weight")))
        up = F.silu(F.linear(h, p(pre + "mlp.gate_proj.weight"))) * F.linear(h, p(pre + "mlp.up_proj.weight"))
        x = x + out(F.linear(up, p(pre + "mlp.down_proj.weight")))
    logits = F.linear(into(rms(x, p("model.norm.weight"))), p("lm_head.weight"))
    return GatherLastDim.apply(logits, rank, world) if tp else logits


def local_parts(whole: dict, layout: str, rank: int, world: int) -> dict:
    """This rank's part of each weight (FP32 master), as the layout holds it."""
    out = {}
    for name, t in whole.items():
        split = megatron_split(name) if layout == "megatron" else COLUMN
        if split == REPLICATED:
            out[name] = t.clone()
        elif split == ROW:
            cols = t.shape[1] // world
            out[name] = t[:, rank * cols:(rank + 1) * cols].clone()
        elif layout == "megatron":
            rows = t.shape[0] // world
            out[name] = t[rank * rows:(rank + 1) * rows].clone()
        else:
            start, end = row_range(t.shape[0], rank, world)
            out[name] = t[start:end].clone()
    return out


def rows_of_row_parallel(local: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """A row-parallel weight's dim-0 range for this rank, from every rank's columns: rank s sends
    each rank r its columns of r's rows (point to point; only this weight's share moves)."""
    rows = local.shape[0] // world
    mine = [None] * world
    requests = []
    for s in range(world):
        if s == rank:
            mine[s] = local[rank * rows:(rank + 1) * rows]
            continue
        requests.append(dist.isend(local[s * rows:(s + 1) * rows].contiguous(), s))
        mine[s] = torch.empty(rows, local.shape[1], dtype=local.dtype)
        requests.append(dist.irecv(mine[s], s))
    for r in requests:
        r.wait()
    return torch.cat(mine, dim=1)


def published_parts(params: dict, shapes: dict, layout: str, rank: int, world: int) -> dict:
    """What this rank publishes: its dim-0 range of every tensor as deltacast.Rows (BF16), and for
    Megatron's replicated norms, rank 0 the whole tensor."""
    out = {}
    for name, p in params.items():
        rows = shapes[name][0]
        local = p.detach().to(torch.bfloat16)
        if layout == "fsdp":
            start, end = row_range(rows, rank, world)
            if end > start:
                out[name] = deltacast.Rows(local, start, rows)
            continue
        split = megatron_split(name)
        if split == REPLICATED:
            if rank == 0:
                out[name] = local
            continue
        if split == ROW:
            local = rows_of_row_parallel(local, rank, world)
        out[name] = deltacast.Rows(local, rank * local.shape[0], rows)
    return out


def run_rank(rank, world, port, origin, args, merged_all):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # every rank starts from the same model, then keeps its part
    whole = {n: p.detach().clone() for n, p in TinyLlama(VOCAB, DIM, LAYERS, HEADS, FFN).named_parameters()}
    shapes = {n: tuple(t.shape) for n, t in whole.items()}
    params = {n: t.requires_grad_() for n, t in local_parts(whole, args.layout, rank, world).items()}
    del whole
    opt = torch.optim.AdamW(params.values(), lr=args.lr, weight_decay=0.01)
    # fsdp: each rank its own batches (data parallel); megatron: the same batches on every rank.
    g = torch.Generator().manual_seed(args.seed * 1000 + (rank if args.layout == "fsdp" else 0))
    if args.layout == "fsdp":
        def weight(name):
            return GatherRows.apply(params[name], shapes[name][0], rank, world)
    else:
        def weight(name):
            return params[name]
    scratch = Path(args.scratch) if args.scratch else None
    with deltacast.Publisher(origin=origin, shard=(rank, world)) as pub:
        for step in range(args.steps + 1):
            if step > 0:
                tokens = batch(VOCAB, g)
                logits = forward(weight, tokens[:, :-1], args.layout, rank, world)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            parts = published_parts(params, shapes, args.layout, rank, world)
            version = pub.publish(parts, version=step + 1)
            if scratch:
                torch.save({n: (p.tensor, p.start) if isinstance(p, deltacast.Rows) else (p, 0) for n, p in parts.items()},
                           scratch / f"v{version}-rank{rank}.pt")
            if rank == 0:
                loss_text = f"loss {loss.item():.4f}, " if step > 0 else ""
                print(f"step {step}: {loss_text}published version {version} from {world} ranks", flush=True)
        merged_all.wait()  # the slices are on their way until the origin has merged them
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def whole_from_parts(scratch: Path, version: int, world: int) -> dict:
    """The merged version as the ranks' parts make it: each tensor's rows from the ranks that hold them."""
    pieces = {}
    for rank in range(world):
        for name, (tensor, start) in torch.load(scratch / f"v{version}-rank{rank}.pt").items():
            pieces.setdefault(name, []).append((start, tensor))
    return {name: torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])]) for name, parts in pieces.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, help="endpoint relays and workers connect to")
    ap.add_argument("--layout", choices=("fsdp", "megatron"), default="fsdp")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="check every merged version against the ranks' parts")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for the ranks and the merges")
    args = ap.parse_args()
    if args.layout == "megatron" and any(n % args.ranks for n in (VOCAB, DIM, HEADS, FFN)):
        ap.error(f"megatron splits heads, the vocabulary and the MLP evenly: --ranks must divide {HEADS}")
    last = args.steps + 1
    with tempfile.TemporaryDirectory() as scratch, deltacast.Publisher(args.listen, expect_shards=args.ranks) as origin:
        args.scratch = scratch if args.check else None
        print(f"origin listening on {origin.listening}, run {origin.run}, merging {args.ranks} trainer shards", flush=True)
        checker = deltacast.Worker("shard-check", [origin.listening]) if args.check else None
        seen = {}
        if checker:
            checker.on_version(lambda v: seen.setdefault(v.number, dict(v.tensors())))
        merged_all = mp.get_context("spawn").Event()
        ranks = mp.start_processes(run_rank, args=(args.ranks, free_port(), origin.listening, args, merged_all), nprocs=args.ranks,
                                   join=False, start_method="spawn")
        reported, deadline = 0, time.monotonic() + args.timeout
        while reported < last:
            if time.monotonic() > deadline:
                print(f"only {reported} of {last} versions merged in {args.timeout:.0f} s", file=sys.stderr)
                return 1
            if not all(p.is_alive() for p in ranks.processes) and any(p.exitcode for p in ranks.processes):
                print("a rank failed", file=sys.stderr)
                return 1
            newest = origin.version  # read once: it may move while this reports
            for v in range(reported + 1, newest + 1):
                print(f"merged version {v} from {args.ranks} shards", flush=True)
            reported = max(reported, newest)
            time.sleep(0.05)
        merged_all.set()
        ranks.join()
        if checker:
            checker.wait(last, timeout=args.timeout)
            for version in sorted(seen):
                want = whole_from_parts(Path(scratch), version, args.ranks)
                got = seen[version]
                bad = [n for n, t in want.items() if not torch.equal(got[n].view(torch.int16), t.view(torch.int16))]
                if list(got) != list(want) or bad:
                    print(f"version {version} differs from the ranks' parts: {bad or 'tensor order'}", file=sys.stderr)
                    return 1
                print(f"version {version}: every tensor whole, bit for bit the ranks' parts", flush=True)
            checker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
