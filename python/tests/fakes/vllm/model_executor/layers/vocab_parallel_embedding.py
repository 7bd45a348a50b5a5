"""Stand-in for vllm/model_executor/layers/vocab_parallel_embedding.py at vLLM commit
00db0119c37674b956dec4228d4e571549020976, written from that file: the vocabulary is padded to a
multiple of 64 (``pad_vocab_size``), each rank holds padded_vocab / tp rows, and ``weight_loader``
copies this rank's rows of the checkpoint and writes zeros into its padded rows.

Differences from upstream: tensor-parallel rank and size are constructor arguments; no added
(LoRA) vocabulary; no forward.
"""
import torch
from torch.nn import Parameter

from vllm.model_executor.layers.linear import divide, set_weight_attrs

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    return ((vocab_size + pad_to - 1) // pad_to) * pad_to


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype=None, *, tp_rank: int = 0, tp_size: int = 1,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.org_vocab_size = num_embeddings
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size)
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, tp_size)
        padded_start = tp_rank * self.num_embeddings_per_partition
        self.org_vocab_start_index = min(padded_start, num_embeddings)
        self.org_vocab_end_index = min(padded_start + self.num_embeddings_per_partition, num_embeddings)
        self.weight = Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim,
                                            dtype=params_dtype or torch.get_default_dtype()), requires_grad=False)
        set_weight_attrs(self.weight, {"output_dim": 0, "weight_loader": self.weight_loader})

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor):
        output_dim = getattr(param, "output_dim", None)
        if output_dim is None:
            assert param.data.shape == loaded_weight.shape
            param.data.copy_(loaded_weight)
            return
        start_idx = self.org_vocab_start_index
        shard_size = self.org_vocab_end_index - start_idx
        assert loaded_weight.shape[output_dim] == self.org_vocab_size
        loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        param[: loaded_weight.shape[0]].data.copy_(loaded_weight)
        param[loaded_weight.shape[0]:].data.fill_(0)


class ParallelLMHead(VocabParallelEmbedding):
    pass
