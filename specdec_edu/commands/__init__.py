"""The command-line commands (``python -m specdec_edu demo | bench``), one module each."""
