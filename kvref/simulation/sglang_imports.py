"""What SGLang imports at module level and never runs on a CPU, put in place so that its package loads.

SGLang's package imports its model configurations, which import ``transformers`` and, for some
vision models, ``torchvision``. PyPI's torchvision does not import beside torch's CPU build, so
where torchvision is missing :func:`stand_in_torchvision` imports ``transformers`` first (it then
knows torchvision is absent) and puts an empty ``torchvision`` in its place; nothing SGLang's KV
cache or scheduler runs touches it. Used by the serving replay on SGLang's scheduler and by the
conformance suite's SGLang peers.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["stand_in", "stand_in_torchvision"]


def stand_in(*names: str) -> None:
    """Empty packages under ``names`` (parents first) whose every attribute is an empty class."""

    def attribute(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    for name in names:
        module = types.ModuleType(name)
        module.__path__ = []
        module.__file__ = f"<kvref stand-in for {name}>"
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def stand_in_torchvision() -> None:
    """An empty ``torchvision`` where none is installed, put in place once, after ``transformers``
    has decided that torchvision is absent (older SGLang releases import ``torchvision.io`` too)."""
    if importlib.util.find_spec("torchvision") is None and "torchvision" not in sys.modules:
        import transformers.image_utils  # noqa: F401  (decides, before the stand-in exists)

        stand_in("torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.io")
