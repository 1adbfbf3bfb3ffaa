"""The one place that imports PyTorch for the runtime: with a message that says how to
install it when it is missing. Torch-side modules (``torch_model``, ``executor``,
``pytorch_runtime``, ``worker``, ``layer_timing``) call it at import; everything else imports
those modules inside functions, so ``import pipesched`` never needs torch."""

from __future__ import annotations

from types import ModuleType

from pipesched.errors import PipeschedError

INSTALL_HINT = "torch is not installed; install it with pip install 'pipesched[torch]'"


def require_torch() -> ModuleType:
    """The ``torch`` module, or a PipeschedError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise PipeschedError(INSTALL_HINT) from None
    return torch
