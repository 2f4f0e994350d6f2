"""torch_of(x): whether a state is a torch tensor or a NumPy array, asked without importing torch. A torch tensor
exists only once torch is imported, so reading a saved run (NumPy rows only: `hookstats report`) never loads it."""
import sys


def torch_of(x):
    """The torch module where x is a torch tensor, else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None
