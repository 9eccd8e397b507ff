"""Reports (floor 3): results as Markdown tables and plots for people.

- :mod:`~kvref.reports.summary`: ``kvref report``, conformance results, benchmark runs and replays
  as one Markdown document;
- :mod:`~kvref.reports.replay`: the report ``kvref replay --out`` writes, with its hit-rate plot;
- :mod:`~kvref.reports.bench_plots`: plots of a benchmark run.

matplotlib (the ``plots`` extra) is loaded only when a plot is drawn.
"""
