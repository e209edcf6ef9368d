"""The training thread only: the recorder (C accelerator or its pure-Python twin), device timing,
the active-phase context.
"""
