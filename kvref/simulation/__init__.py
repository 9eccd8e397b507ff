"""Simulation (floor 2): traces, generated workloads, replay through any pool, Belady's bound.

- :mod:`~kvref.simulation.traces`: loading and checking traces (chapter 10);
- :mod:`~kvref.simulation.workloads`: the built-in generated workloads;
- :mod:`~kvref.simulation.replay`: replaying a trace through a pool, one request at a time;
- :mod:`~kvref.simulation.belady`: Belady's MIN, the offline bound beside a replay.

A new kind of replay (a serving replay of overlapping requests) is a new module here.
"""
