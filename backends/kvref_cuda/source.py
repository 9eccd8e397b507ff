"""The CUDA C of the array surfaces' fused calls: one launch per call (ERR-511, ERR-513, RADIX-606, POOL-108).

Each kernel does what the array path of its surface does, over the same arrays and record
(:mod:`kvref_arraypool.deferred`'s layout: code, call, position, value, refused calls, calls, then
the owner's counters), with the same result (``tests/test_cuda_kernels.py`` holds each to the array
path, on a GPU or compiled for the CPU under ``tests/cuda_emulation.py``):

* ``slot_alloc_*``: a grid over the slots taken from the free ring at the host-known head: mark
  the pages held, bump the slots' versions, write the fresh output; thread 0 lowers the ring's
  device length (:class:`kvref_arraypool.slot_arrays.DeviceSlotAllocator`);
* ``slot_free_*``: one thread block over the whole call (up to 4,096 entries, each thread a
  contiguous run of at most four, read and divided by the page size once, into registers, so a
  thread's loads go out together): the per-entry codes, the first offending entry into the record, then, when the
  call is accepted, the first occurrence of each page (an ``atomicMin`` of positions between two
  barriers) and the release to the back of the ring or release list at ``count + rank`` (a block
  scan), or in an open group the mark and the group's parts;
* ``slot_free_alloc_*``: a scheduler step's ``free`` then ``alloc`` in one thread block, one
  launch (RADIX-616);
* ``block_allocate_*``: one thread block pops ``total`` blocks off the free stack for one request
  slot (:class:`kvref_arraypool.block_arrays.DeviceBlockPool`);
* ``block_call_*``: one thread block checks and applies a ``free`` or ``acquire`` of one request
  slot, as ``slot_free``.

A refused call writes nothing but the record (ERR-501). Every kernel comes in an ``_i32`` and an
``_i64`` form, for the dtype of the ids it reads or writes. Every parameter is 8 bytes (an address
or an ``i64``), so a launch passes one buffer of 8-byte slots (:mod:`kvref_cuda.kernels`).
"""

from __future__ import annotations

__all__ = ["KERNELS", "MAX_CALL", "MAX_THREADS", "PARAMETERS", "SOURCE"]

#: The most entries one ``slot_free`` or ``block_call`` takes (a larger call takes the array path).
MAX_CALL = 4096
#: Threads of one block (a call's entries are spread over them, a contiguous run each).
MAX_THREADS = 1024

_COMMON = r"""
typedef long long i64;
#define KVREF_MAX_THREADS @MAX_THREADS@
#define KVREF_PER @PER@

// The exclusive prefix sum of `value` over the block's threads, in thread order; `total` gets the sum.
__device__ i64 kvref_scan(i64 value, i64* total) {
    __shared__ i64 buf[KVREF_MAX_THREADS];
    const int t = threadIdx.x;
    buf[t] = value;
    __syncthreads();
    for (int offset = 1; offset < blockDim.x; offset <<= 1) {
        const i64 add = t >= offset ? buf[t - offset] : 0;
        __syncthreads();
        buf[t] += add;
        __syncthreads();
    }
    *total = buf[blockDim.x - 1];
    const i64 inclusive = buf[t];
    __syncthreads();
    return inclusive - value;
}

// The record update every checked call makes (deferred.py): given each thread's first offending
// entry (mine == m: none), write the call's first one if no earlier error waits, count the call
// (and its refusal). Returns the call's first offending position, m when it is accepted.
__device__ i64 kvref_note(i64* rec, i64 m, i64 mine, i64 code, i64 value) {
    __shared__ unsigned long long first;
    __shared__ i64 first_code, first_value;
    if (threadIdx.x == 0) first = (unsigned long long)m;
    __syncthreads();
    if (mine < m) atomicMin(&first, (unsigned long long)mine);
    __syncthreads();
    const i64 pos = (i64)first;
    if (pos < m && mine == pos) { first_code = code; first_value = value; }
    __syncthreads();
    if (threadIdx.x == 0) {
        const i64 refused = pos < m ? 1 : 0;
        const i64 calls = rec[5];
        if (refused && rec[0] == 0) { rec[0] = first_code; rec[1] = calls; rec[2] = pos; rec[3] = first_value; }
        rec[4] += refused;
        rec[5] = calls + 1;
    }
    return pos;
}

// The contiguous run of entries [lo, hi) of this thread: at most KVREF_PER of them, since a call
// has at most MAX_CALL entries and a block of fewer than MAX_THREADS threads has a warp per 32 entries.
__device__ void kvref_run(i64 m, i64* lo, i64* hi) {
    const i64 per = (m + blockDim.x - 1) / blockDim.x;
    *lo = min(m, (i64)threadIdx.x * per);
    *hi = min(m, *lo + per);
}

// a / b for 0 <= a and 0 < b, in 32 bits where both fit: a 64-bit division is a long software
// routine on a GPU, and a call divides each of its thousands of slots by the page size.
__device__ __forceinline__ i64 kvref_div(i64 a, i64 b) {
    if ((unsigned long long)(a | b) <= 0xffffffffull) return (i64)((unsigned)a / (unsigned)b);
    return a / b;
}

// a % n for 0 <= a, one subtraction where a < 2n: every ring index is the head (below n) plus a
// count of at most n pages.
__device__ __forceinline__ i64 kvref_wrap(i64 a, i64 n) {
    return a < n ? a : a - n < n ? a - n : a % n;
}
"""

_SLOT = r"""
// A slot's page, 0 (the padding page) for a slot out of range.
__device__ __forceinline__ i64 kvref_page(i64 s, i64 top, i64 page_size) {
    return (s < 0 || s >= top) ? 0 : kvref_div(s, page_size);
}

// Slot i of an allocation of pages from the ring at `head`: its page marked held (by the page's
// first slot), its version bumped, written to the output.
template <typename T>
__device__ __forceinline__ void kvref_take(const i64* ring, i64* state, i64* version, T* out, i64 head, i64 i,
                                           i64 num_pages, i64 page_size) {
    const i64 k = kvref_div(i, page_size), offset = i - k * page_size;
    const i64 page = ring[kvref_wrap(head + k, num_pages)];
    if (offset == 0) state[page] = 1;
    const i64 slot = page * page_size + offset;
    version[slot] += 1;
    out[i] = (T)slot;
}

template <typename T>
__device__ void slot_alloc(const i64* ring, i64* state, i64* version, i64* rec, T* out,
                           i64 head, i64 want, i64 num_pages, i64 page_size) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < want * page_size) kvref_take<T>(ring, state, version, out, head, i, num_pages, page_size);
    if (i == 0) rec[6] -= want;
}

template <typename T>
__device__ void slot_free(const T* slots, i64 m, i64* state, i64* first, i64* ring, i64* released, i64* rec,
                          i64* page_out, bool* keep_out, i64 head, i64 num_pages, i64 page_size,
                          i64 sort, i64 group) {
    i64 lo, hi;
    kvref_run(m, &lo, &hi);
    const i64 top = (num_pages + 1) * page_size;
    // This thread's entries and their pages, read and divided once (the loops below are unrolled over
    // them, so their loads go out together).
    i64 slot[KVREF_PER], page[KVREF_PER];
    bool mine_entry[KVREF_PER];
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k) {
        mine_entry[k] = lo + k < hi;
        slot[k] = mine_entry[k] ? (i64)slots[lo + k] : 0;
        page[k] = kvref_page(slot[k], top, page_size);
    }
    i64 mine = m, code = 0, value = 0;
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k) {
        const i64 s = slot[k];
        const i64 c = (s < 0 || s >= top) ? 1 : page[k] == 0 ? 2 : state[page[k]] == 1 ? 0 : 3;
        if (mine_entry[k] && c && mine == m) { mine = lo + k; code = c; value = s; }
    }
    const i64 pos = kvref_note(rec, m, mine, code, value);
    if (pos < m) {  // refused: the record and, in a group, parts that keep nothing (ERR-501)
        for (int k = 0; group && k < KVREF_PER; ++k) {
            if (!mine_entry[k]) continue;
            page_out[lo + k] = page[k];
            keep_out[lo + k] = false;
        }
        return;
    }
    // Accepted: every slot is in range, on a held page. The first entry naming each page keeps it.
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k)
        if (mine_entry[k]) first[page[k]] = m;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k)
        if (mine_entry[k]) atomicMin(&first[page[k]], lo + k);
    __syncthreads();
    bool keep[KVREF_PER];
    i64 kept = 0;
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k) {
        keep[k] = mine_entry[k] && first[page[k]] == lo + k;
        kept += keep[k];
        if (group && mine_entry[k]) { page_out[lo + k] = page[k]; keep_out[lo + k] = keep[k]; }
    }
    __syncthreads();  // every read of `first` is done before the pages' state changes
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k)
        if (keep[k]) state[page[k]] = group ? 2 : 0;
    if (group) return;
    i64 total;
    i64 rank = kvref_scan(kept, &total);
    i64* counter = sort ? rec + 7 : rec + 6;
    const i64 count = *counter;
#pragma unroll
    for (int k = 0; k < KVREF_PER; ++k) {
        if (!keep[k]) continue;
        if (sort) released[count + rank] = page[k];
        else ring[kvref_wrap(head + count + rank, num_pages)] = page[k];
        ++rank;
    }
    __syncthreads();  // every thread has read the counter
    if (threadIdx.x == 0) *counter = count + total;
}

// A scheduler step in one block (RADIX-616): free `slots` as slot_free does, then, once its checks and
// writes are done, take `want` pages from the ring at `head` as slot_alloc does. The pages the free
// appends lie past the ring's live part, which holds the `want` pages (the host's floor covers them).
template <typename T, typename U>
__device__ void slot_free_alloc(const T* slots, i64 m, i64* state, i64* first, i64* ring, i64* released,
                                i64* rec, i64* version, U* out, i64 head, i64 want, i64 num_pages,
                                i64 page_size, i64 sort) {
    slot_free<T>(slots, m, state, first, ring, released, rec, nullptr, nullptr, head, num_pages, page_size,
                 sort, 0);
    __syncthreads();
    for (i64 i = threadIdx.x; i < want * page_size; i += blockDim.x)
        kvref_take<U>(ring, state, version, out, head, i, num_pages, page_size);
    if (threadIdx.x == 0) rec[6] -= want;
}
"""

_BLOCK = r"""
template <typename T>
__device__ void block_allocate(const i64* stack, i64* ref, i64* gen, i64* bits, i64* rec, T* out,
                               i64 total, i64 words, i64 word, i64 bit) {
    const i64 top = rec[6];
    for (i64 k = threadIdx.x; k < total; k += blockDim.x) {
        const i64 block = stack[top - 1 - k];
        ref[block] = 1;
        gen[block] += 1;
        bits[block * words + word] = bit;  // a free block's row is all zero
        out[k] = (T)block;
    }
    __syncthreads();  // every thread has read the counter
    if (threadIdx.x == 0) rec[6] = top - total;
}

template <typename T>
__device__ void block_call(const T* ids, i64 m, i64 num_blocks, i64* ref, i64* bits, const bool* reserved,
                           i64* first, i64* stack, i64* rec, i64 words, i64 word, i64 bit, i64 is_free) {
    i64 lo, hi;
    kvref_run(m, &lo, &hi);
    // The first occurrence of each block named: ids out of range all go to the dump index.
    for (i64 i = lo; i < hi; ++i) {
        const i64 b = (i64)ids[i];
        first[(b < 0 || b >= num_blocks) ? num_blocks : b] = m;
    }
    __syncthreads();
    for (i64 i = lo; i < hi; ++i) {
        const i64 b = (i64)ids[i];
        atomicMin(&first[(b < 0 || b >= num_blocks) ? num_blocks : b], i);
    }
    __syncthreads();
    i64 mine = m, code = 0, value = 0;
    for (i64 i = lo; i < hi && mine == m; ++i) {
        const i64 b = (i64)ids[i];
        const bool out = b < 0 || b >= num_blocks;
        const i64 safe = out ? num_blocks : b;
        const bool held = (bits[safe * words + word] & bit) != 0;
        const bool once = first[safe] == i;
        i64 c;
        if (out) c = 1;
        else if (reserved[safe]) c = 2;
        else if (is_free) c = held ? (once ? 0 : 5) : 3;
        else c = ref[safe] == 0 ? 6 : (held || !once) ? 7 : 0;
        if (c) { mine = i; code = c; value = b; }
    }
    const i64 pos = kvref_note(rec, m, mine, code, value);
    if (pos < m) return;  // refused: the record only (ERR-501)
    // Accepted: each block is named once, in range, not reserved.
    i64 zero = 0;
    for (i64 i = lo; i < hi; ++i) {
        const i64 b = (i64)ids[i];
        const i64 at = b * words + word;
        if (is_free) {
            bits[at] &= ~bit;
            ref[b] -= 1;
            zero += ref[b] == 0;
        } else {
            bits[at] |= bit;
            ref[b] += 1;
        }
    }
    if (!is_free) return;
    i64 total;
    i64 rank = kvref_scan(zero, &total);
    const i64 count = rec[6];
    for (i64 i = lo; i < hi; ++i) {
        const i64 b = (i64)ids[i];
        if (ref[b] == 0) stack[count + rank++] = b;
    }
    __syncthreads();  // every thread has read the counter
    if (threadIdx.x == 0) rec[6] = count + total;
}
"""

_ENTRY = r"""
// The entry points; the one-block kernels are compiled for a whole block's threads.
#define KVREF_ONE_BLOCK __launch_bounds__(KVREF_MAX_THREADS)
#define KVREF_ENTRIES(SUFFIX, T)                                                                        \
extern "C" __global__ void slot_alloc_##SUFFIX(const i64* ring, i64* state, i64* version, i64* rec,     \
        T* out, i64 head, i64 want, i64 num_pages, i64 page_size) {                                     \
    slot_alloc<T>(ring, state, version, rec, out, head, want, num_pages, page_size); }                  \
extern "C" __global__ void KVREF_ONE_BLOCK slot_free_##SUFFIX(const T* slots, i64 m, i64* state,        \
        i64* first, i64* ring, i64* released, i64* rec, i64* page_out, bool* keep_out, i64 head,        \
        i64 num_pages, i64 page_size, i64 sort, i64 group) {                                            \
    slot_free<T>(slots, m, state, first, ring, released, rec, page_out, keep_out, head, num_pages,      \
                 page_size, sort, group); }                                                              \
extern "C" __global__ void KVREF_ONE_BLOCK block_allocate_##SUFFIX(const i64* stack, i64* ref,          \
        i64* gen, i64* bits, i64* rec, T* out, i64 total, i64 words, i64 word, i64 bit) {               \
    block_allocate<T>(stack, ref, gen, bits, rec, out, total, words, word, bit); }                       \
extern "C" __global__ void KVREF_ONE_BLOCK block_call_##SUFFIX(const T* ids, i64 m, i64 num_blocks,     \
        i64* ref, i64* bits, const bool* reserved, i64* first, i64* stack, i64* rec, i64 words,         \
        i64 word, i64 bit, i64 is_free) {                                                               \
    block_call<T>(ids, m, num_blocks, ref, bits, reserved, first, stack, rec, words, word, bit, is_free); }
KVREF_ENTRIES(i32, int)
KVREF_ENTRIES(i64, long long)

#define KVREF_STEP(SUFFIX, T, U)                                                                        \
extern "C" __global__ void KVREF_ONE_BLOCK slot_free_alloc_##SUFFIX(const T* slots, i64 m, i64* state,  \
        i64* first, i64* ring, i64* released, i64* rec, i64* version, U* out, i64 head, i64 want,       \
        i64 num_pages, i64 page_size, i64 sort) {                                                       \
    slot_free_alloc<T, U>(slots, m, state, first, ring, released, rec, version, out, head, want,         \
                          num_pages, page_size, sort); }
KVREF_STEP(i32_i32, int, int)
KVREF_STEP(i32_i64, int, long long)
KVREF_STEP(i64_i32, long long, int)
KVREF_STEP(i64_i64, long long, long long)
"""

#: The whole translation unit, compiled once per device by NVRTC (CuPy's ``RawModule``). The one-block
#: kernels are compiled for :data:`MAX_THREADS` threads (``__launch_bounds__``), the size of their scan.
SOURCE = (
    (_COMMON + _SLOT + _BLOCK + _ENTRY)
    .replace("@MAX_THREADS@", str(MAX_THREADS))
    .replace("@PER@", str(-(-MAX_CALL // MAX_THREADS)))
)

#: How many parameters each kernel takes (every one 8 bytes).
PARAMETERS = {"slot_alloc": 9, "slot_free": 14, "slot_free_alloc": 14, "block_allocate": 10, "block_call": 13}

_SUFFIXES = ("i32", "i64")
#: Each kernel :data:`SOURCE` defines and the kernel it is a form of: one per ids dtype, and for
#: ``slot_free_alloc`` one per pair of the freed ids' dtype and the output's.
KERNELS = {
    **{f"{base}_{s}": base for base in ("slot_alloc", "slot_free", "block_allocate", "block_call") for s in _SUFFIXES},
    **{f"slot_free_alloc_{a}_{b}": "slot_free_alloc" for a in _SUFFIXES for b in _SUFFIXES},
}
