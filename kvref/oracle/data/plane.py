"""A backend's data plane: chapter 08's classes on its tensor library, as the conformance suite builds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvref.oracle.data.kv import KVBuffers
from kvref.oracle.data.routing import RoutingStore
from kvref.oracle.data.states import StatePool
from kvref.oracle.data.table import ReqToTokenTable
from kvref.oracle.data.tensors import NumpyTensors, Tensors

__all__ = ["DataPlane"]


@dataclass(frozen=True)
class DataPlane:
    """What ``backend.data_plane(device)`` returns (capability ``data-plane``): the tensor library and
    the class of each part; kvref's backends use kvref's classes on their own tensors, and another
    implementation (or a planted bug) gives its own classes with the same signatures."""

    tensors: Tensors
    kv_class: type[Any] = KVBuffers
    table_class: type[Any] = ReqToTokenTable
    states_class: type[Any] = StatePool
    routing_class: type[Any] = RoutingStore

    @classmethod
    def reference(cls) -> DataPlane:
        """kvref's reference: its classes on NumPy in host memory."""
        return cls(NumpyTensors())

    def kv_buffers(self, *args: Any, **kwargs: Any) -> Any:
        """KV buffers (DATA-801..DATA-809) on this library."""
        return self.kv_class(*args, tensors=self.tensors, **kwargs)

    def req_to_token(self, *args: Any, **kwargs: Any) -> Any:
        """A request-to-token table (DATA-810..DATA-814) on this library."""
        return self.table_class(*args, tensors=self.tensors, **kwargs)

    def state_pool(self, *args: Any, **kwargs: Any) -> Any:
        """A recurrent-state pool (DATA-820..DATA-824) on this library."""
        return self.states_class(*args, tensors=self.tensors, **kwargs)

    def routing(self, *args: Any, **kwargs: Any) -> Any:
        """A routing store (DATA-830..DATA-832) on this library."""
        return self.routing_class(*args, tensors=self.tensors, **kwargs)
