"""The recurrent and conv states of linear-attention layers, by request slot and track slot (DATA-820..DATA-825)."""

from __future__ import annotations

from typing import Any

from kvref.contract.errors import BlockIdError, ConfigError, InvalidValueError
from kvref.oracle.data.tensors import DeviceChecked, NumpyTensors, Tensors, chosen_checks, host_indices

__all__ = ["StatePool"]


class StatePool(DeviceChecked):
    """``StatePool(max_reqs, num_layers, num_v_heads, head_k_dim, head_v_dim, conv_dim, conv_kernel_size,
    *, dtype="float16", max_track_slots=0, tensors=None, checks=None)``: slot 0 reserved, request slots
    ``[1, max_reqs]`` (the request table's rows), track slots after them (DATA-820, DATA-821).
    ``checks="device"`` checks the slots of ``reset_states`` and ``copy_states`` given as arrays of the
    tensor library on its device, never reading them back (DATA-825; the default on a CUDA device)."""

    def __init__(
        self,
        max_reqs: int,
        num_layers: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_dim: int,
        conv_kernel_size: int,
        *,
        dtype: str = "float16",
        max_track_slots: int = 0,
        tensors: Tensors | None = None,
        checks: str | None = None,
    ) -> None:
        sizes = {
            "max_reqs": max_reqs,
            "num_layers": num_layers,
            "num_v_heads": num_v_heads,
            "head_k_dim": head_k_dim,
            "head_v_dim": head_v_dim,
            "conv_dim": conv_dim,
            "conv_kernel_size": conv_kernel_size,
        }
        for name, value in sizes.items():
            if type(value) is not int or value < (2 if name == "conv_kernel_size" else 1):
                raise ConfigError("DATA-820", f"StatePool: {name} must be a positive integer, got {value!r}")
        if type(max_track_slots) is not int or max_track_slots < 0:
            raise ConfigError(
                "DATA-821", f"StatePool: max_track_slots must be an integer >= 0, got {max_track_slots!r}"
            )
        self.tensors: Tensors = tensors or NumpyTensors()
        self.max_reqs, self.max_track_slots, self.dtype = max_reqs, max_track_slots, dtype
        self.slots = 1 + max_reqs + max_track_slots
        t = self.tensors
        self.recurrent_state = t.zeros((num_layers, self.slots, num_v_heads, head_v_dim, head_k_dim), "float32")
        self.conv_state = t.zeros((num_layers, self.slots, conv_dim, conv_kernel_size - 1), dtype)
        self._track_free = list(range(self.slots - 1, max_reqs, -1))  # pop() hands out the lowest first
        self._track_held: set[int] = set()
        self._checks = chosen_checks(t, self.slots, checks, owner="StatePool", rule="DATA-825")

    def _checked(self, slots: object, op: str, arg: str) -> Any:
        host = host_indices(slots, op=op, arg=arg).ravel()
        if host.size and (int(host.min()) < 0 or int(host.max()) >= self.slots):
            raise BlockIdError("DATA-821", f"{op}: {arg} {host.tolist()} outside [0, {self.slots})")
        return host

    def reset_states(self, slots: object) -> None:
        """Zero both states of every slot given (DATA-822); device slots are checked there (DATA-825)."""
        checks = self._checks
        taken = checks.take(slots) if checks is not None else None
        if checks is not None and taken is not None:
            where = checks.states(taken[0], op="reset_states")
        else:
            where = self.tensors.index(self._checked(slots, "reset_states", "slots"))
        self.recurrent_state[:, where] = 0
        self.conv_state[:, where] = 0

    def copy_states(self, src: object, dst: object) -> None:
        """Make both states of each ``dst`` slot those of its ``src`` slot (DATA-823); device slots are
        checked there, their counts on the host from their shapes (DATA-825)."""
        op = "copy_states"
        checks = self._checks
        s_taken = checks.take(src) if checks is not None else None
        d_taken = checks.take(dst) if checks is not None else None
        if checks is not None and s_taken is not None and d_taken is not None:
            s_flat, d_flat = s_taken[0], d_taken[0]
            if len(s_flat) != len(d_flat):
                raise InvalidValueError("DATA-823", f"{op}: {len(s_flat)} src and {len(d_flat)} dst slots")
            si, di = checks.state_copies(s_flat, d_flat, op=op)
        else:
            s, d = self._checked(src, op, "src"), self._checked(dst, op, "dst")
            if len(s) != len(d) or (d.size and int(d.min()) == 0):
                raise InvalidValueError("DATA-823", f"{op}: {len(s)} src and {len(d)} dst slots; slot 0 is never a dst")
            si, di = self.tensors.index(s), self.tensors.index(d)
        self.recurrent_state[:, di] = self.recurrent_state[:, si]
        self.conv_state[:, di] = self.conv_state[:, si]

    def alloc_track_slot(self) -> int | None:
        """A track slot, or None when none is free (DATA-821)."""
        if not self._track_free:
            return None
        slot = self._track_free.pop()
        self._track_held.add(slot)
        return slot

    def free_track_slot(self, slot: int) -> None:
        """Return a track slot; one not handed out is refused, changing nothing (DATA-821)."""
        if type(slot) is not int or slot not in self._track_held:
            raise InvalidValueError("DATA-821", f"free_track_slot: slot {slot!r} is not a track slot handed out")
        self._track_held.discard(slot)
        self._track_free.append(slot)

    def layer_state(self, layer: int) -> tuple[Any, Any]:
        """Views of ``layer``'s states (DATA-824): ``[slots, v_heads, head_v_dim, head_k_dim]`` and
        ``[slots, conv_dim, conv_kernel_size - 1]``."""
        if type(layer) is not int or not 0 <= layer < self.recurrent_state.shape[0]:
            raise BlockIdError("DATA-821", f"layer_state: layer {layer!r} outside the pool")
        return self.recurrent_state[layer], self.conv_state[layer]

    def read_states(self, slot: int) -> tuple[Any, Any]:
        """Fresh copies of one slot's states, every layer (DATA-824)."""
        where = self.tensors.index(self._checked([slot], "read_states", "slot"))
        return self.recurrent_state[:, where], self.conv_state[:, where]

    def write_states(self, slot: int, recurrent: Any, conv: Any) -> None:
        """Set one slot's states, every layer (what a forward pass leaves there)."""
        where = self.tensors.index(self._checked([slot], "write_states", "slot"))
        t = self.tensors
        self.recurrent_state[:, where] = t.values(recurrent, "float32").reshape(self.recurrent_state[:, where].shape)
        self.conv_state[:, where] = t.values(conv, self.dtype).reshape(self.conv_state[:, where].shape)

    def mem_bytes(self) -> int:
        """Bytes of both states (DATA-824)."""
        return self.tensors.nbytes(self.recurrent_state) + self.tensors.nbytes(self.conv_state)
