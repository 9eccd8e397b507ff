"""The oracle's data plane (spec chapter 08): KV buffers, the request-to-token table, the recurrent-state
pool and routing per block, over a tensor library (NumPy on the host here; torch and CuPy in the backends).

``kv.py`` holds the K and V buffers and prefix copy, ``table.py`` the request-to-token table,
``states.py`` the recurrent and conv states, ``routing.py`` MoE routing per block, ``tensors.py``
the library they stand on, ``plane.py`` the set of them a backend offers.
This room loads NumPy; ``import kvref`` does not load this room.
"""

from kvref.oracle.data.kv import KVBuffers
from kvref.oracle.data.plane import DataPlane
from kvref.oracle.data.routing import RoutingStore
from kvref.oracle.data.states import StatePool
from kvref.oracle.data.table import ReqToTokenTable
from kvref.oracle.data.tensors import NumpyTensors, Tensors, host_indices

__all__ = [
    "DataPlane",
    "KVBuffers",
    "NumpyTensors",
    "ReqToTokenTable",
    "RoutingStore",
    "StatePool",
    "Tensors",
    "host_indices",
]
