"""Stand-in for vllm/model_executor/model_loader/weight_utils.py: ``default_weight_loader``, which
vllm/model_executor/models/gpt2.py at 017689429418547490506c3bf52419a806c115d7 and llama.py at
0035bdf2b1ac243ef6f31eef27411b022461df8e use for parameters without a loader of their own (norms,
nn.Embedding): a whole copy, shapes checked."""
import torch


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
        return
    assert param.size() == loaded_weight.size(), f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
    param.data.copy_(loaded_weight)
