"""Stand-in for python/sglang/srt/utils/patch_torch.py at SGLang commit
f82ccc94b0e7c45d7e8e856b92eda8f0062a21c3: ``monkey_patch_torch_reductions`` makes CUDA tensors
pickle with their GPU's UUID instead of its index. It changes nothing for CPU tensors, so this
stand-in (CPU only) does nothing."""


def monkey_patch_torch_reductions():
    return
