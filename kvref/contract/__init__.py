"""The contract every implementation shares (floor 0): what a pool is and how it fails.

- :mod:`~kvref.contract.protocol`: the protocols (``BlockPool``, ``PrefixCache``, capabilities);
- :mod:`~kvref.contract.errors`: the error tree, each error naming its rule (chapter 05);
- :mod:`~kvref.contract.checks`: the order of precondition checks of each operation, and the
  explainers that name the first broken one (ERR-509);
- :mod:`~kvref.contract.events`: KV events and hit statistics (chapter 03);
- :mod:`~kvref.contract.validate`: argument checks every implementation runs alike;
- :mod:`~kvref.contract.policies`: the eviction policies (chapter 04);
- :mod:`~kvref.contract.hashing`: block hashing (chapter 02);
- :mod:`~kvref.contract.shape`, :mod:`~kvref.contract.pausing`: mixins for a pool's size and
  paused holders, shared by the oracle, the array core and the peers' adapters.

Nothing here imports anything of kvref above this floor.
"""
