"""Span records, the one currency of spans: step records made span records and rows, StepView,
attribute values.
"""
