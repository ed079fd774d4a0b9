"""TransformerLens imports that work on 3.x and 4.x (4.x moved HookedRootModule)."""

from __future__ import annotations

from transformer_lens import ActivationCache
from transformer_lens.hook_points import HookPoint

try:  # TransformerLens >= 4
    from transformer_lens import HookedRootModule
except ImportError:  # pragma: no cover - TransformerLens 3.x
    from transformer_lens.hook_points import HookedRootModule  # type: ignore[no-redef]

__all__ = ["ActivationCache", "HookPoint", "HookedRootModule", "observed"]


def observed(*hooks: HookPoint) -> bool:
    """Whether any hook function is attached to these hook points.

    Layers use it to take fused kernels (SDPA, ``F.layer_norm``) when nobody reads the
    intermediate tensors those kernels never materialize.
    """
    return any(h._forward_hooks or h._backward_hooks for h in hooks)
