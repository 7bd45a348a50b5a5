"""Checkpoints and models for the adapter tests: Llama and GPT-2 as the vLLM stand-ins hold them
(fakes/vllm/model_executor/models; SGLang's Llama loads the same way, so its tests use the same
model), and the oracle every test checks a model against: the same model built fresh and loaded
whole, from the same checkpoint, by the engine's own loader."""

from __future__ import annotations

import torch

from vllm.model_executor.layers.quantization.base_config import RepackedLinearMethod
from vllm.model_executor.models.gpt2 import GPT2Config, GPT2LMHeadModel
from vllm.model_executor.models.llama import LlamaConfig, LlamaForCausalLM
from vllm.v1.worker.gpu_worker import build_model


def llama_checkpoint(config: LlamaConfig = LlamaConfig(), seed: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """A Llama checkpoint in Hugging Face names and shapes."""
    g = torch.Generator().manual_seed(seed)
    head_dim = config.hidden_size // config.num_attention_heads

    def w(*shape, base=0.0):
        return (base + torch.randn(*shape, generator=g) * 0.05).to(dtype)

    h, kv = config.hidden_size, config.num_key_value_heads * head_dim
    sd = {"model.embed_tokens.weight": w(config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = w(config.num_attention_heads * head_dim, h)
        sd[p + "self_attn.k_proj.weight"] = w(kv, h)
        sd[p + "self_attn.v_proj.weight"] = w(kv, h)
        sd[p + "self_attn.o_proj.weight"] = w(h, config.num_attention_heads * head_dim)
        sd[p + "mlp.gate_proj.weight"] = w(config.intermediate_size, h)
        sd[p + "mlp.up_proj.weight"] = w(config.intermediate_size, h)
        sd[p + "mlp.down_proj.weight"] = w(h, config.intermediate_size)
        sd[p + "input_layernorm.weight"] = w(h, base=1.0)
        sd[p + "post_attention_layernorm.weight"] = w(h, base=1.0)
    sd["model.norm.weight"] = w(h, base=1.0)
    sd["lm_head.weight"] = w(config.vocab_size, h)
    return sd


def gpt2_checkpoint(config: GPT2Config = GPT2Config(), seed: int = 0, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """A GPT-2 checkpoint in Hugging Face names and Conv1D ([in, out]) shapes."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, base=0.0):
        return (base + torch.randn(*shape, generator=g) * 0.05).to(dtype)

    n = config.n_embd
    sd = {"wte.weight": w(config.vocab_size, n), "wpe.weight": w(config.n_positions, n)}
    for i in range(config.n_layer):
        p = f"h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = w(n, base=1.0), w(n)
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = w(n, 3 * n), w(3 * n)
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = w(n, n), w(n)  # square: only the loader knows it is transposed
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = w(n, base=1.0), w(n)
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = w(n, 4 * n), w(4 * n)
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = w(4 * n, n), w(n)
    sd["ln_f.weight"], sd["ln_f.bias"] = w(n, base=1.0), w(n)
    return sd


def step(sd: dict[str, torch.Tensor], seed: int, fraction: float = 0.02) -> None:
    """One training step's worth of change: about `fraction` of the values move by one ulp."""
    g = torch.Generator().manual_seed(seed)
    for t in sd.values():
        flat = t.view(-1).view(torch.int16)
        idx = torch.randint(0, flat.numel(), (max(1, int(flat.numel() * fraction)),), generator=g)
        flat[idx] += 1


# Model makers, (rank, world_size) -> model: picklable, for the engine's worker processes.
def make_llama(rank: int = 0, world_size: int = 1, config: LlamaConfig = LlamaConfig()):
    return LlamaForCausalLM(config, tp_rank=rank, tp_size=world_size)


def make_repacked_llama(rank: int = 0, world_size: int = 1, config: LlamaConfig = LlamaConfig()):
    """A Llama whose linear layers are repacked after loading (a quantization kernel's layout)."""
    return LlamaForCausalLM(config, tp_rank=rank, tp_size=world_size, quant_method=RepackedLinearMethod())


def make_gpt2(rank: int = 0, world_size: int = 1, config: GPT2Config = GPT2Config()):
    return GPT2LMHeadModel(config, tp_rank=rank, tp_size=world_size)


class ScaledNormLlama(LlamaForCausalLM):
    """A Llama whose loader scales the norm weights as it loads them (as loaders that fold a
    constant into a weight do): no value of theirs lands as the checkpoint has it."""

    def load_weights(self, weights):
        super().load_weights((name, w * 2 if "norm" in name else w) for name, w in weights)


def make_scaled_norm_llama(rank: int = 0, world_size: int = 1, config: LlamaConfig = LlamaConfig()):
    return ScaledNormLlama(config, tp_rank=rank, tp_size=world_size)


# For the servers the tests start in processes of their own: name -> (make_model, checkpoint).
MODELS = {"llama": (make_llama, llama_checkpoint), "gpt2": (make_gpt2, gpt2_checkpoint)}


def reference(make, rank: int, world_size: int, checkpoint: dict[str, torch.Tensor]):
    """What the engine's own whole load of `checkpoint` gives this rank: the oracle."""
    return build_model(lambda: make(rank, world_size), {n: t.clone() for n, t in checkpoint.items()})


def differing(model, want) -> list[str]:
    """Parameter names whose bits differ between two models of the same kind."""
    theirs = dict(want.named_parameters())
    out = []
    for name, p in model.named_parameters():
        a, b = p.detach(), theirs[name].detach()
        if a.shape != b.shape or not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
            out.append(name)
    return out


def same_as_whole_load(model, make, rank: int, world_size: int, checkpoint) -> list[str]:
    """Parameters of `model` that differ from the engine's own whole load of `checkpoint`."""
    return differing(model, reference(make, rank, world_size, checkpoint))


def raising_loader(model, named_tensors):
    """An SGLang custom loader that raises, as deltacast.sglang's did before it caught everything."""
    raise RuntimeError("version 1 did not verify within 600 s")
