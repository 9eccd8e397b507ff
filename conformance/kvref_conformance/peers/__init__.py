"""Adapters that drive real engines' KV-cache managers through kvref's protocol (never imported by default).

Each module maps kvref's operations onto one peer's API and does the caller-side duties the
peer's own engine does, nothing more, so the conformance suite judges the peer itself. They are
registered as backends (``kvref backends`` lists them, with install hints when the peer is
missing) and run by the ``peer-*`` nox sessions.
"""
