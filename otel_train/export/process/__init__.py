"""The exporter process: the training process's client (lifecycle, launch, outbox, reports,
fallback) and the child.
"""
