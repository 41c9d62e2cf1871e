"""tracekit: predict and explain the iteration time of distributed LLM training from profiler traces."""
__version__ = "0.1.0"
