"""The derived metrics: the chain of step-view processors (slow steps, overhead, budget,
Prometheus, OTLP metrics, console, tail sampling) and the threads around them.
"""
