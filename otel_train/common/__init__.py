"""The contract's names, options, run identity and ids, the OTEL_* configuration, and shared
bookkeeping (drops, own cost, rate-limited logs, atomic files).
"""
