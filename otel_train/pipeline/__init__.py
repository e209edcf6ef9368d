"""The background of the training process and how it is put together: the plan, the assembly, the
span worker, the record sinks.
"""
