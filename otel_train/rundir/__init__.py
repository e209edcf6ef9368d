"""Reading a run directory back: span files, the HTML report, the Chrome trace, the costs table."""
