"""Base classes of the conformance suite, one per spec chapter; subclass them to adopt the suite."""
