"""What must never be committed in a notebook's outputs: install logs and paths of the machine that ran it.

``scripts/execute_notebooks.py`` refuses to write such outputs over a committed notebook, and
``tests/test_execute_notebooks.py`` checks every committed notebook with the same function. The usual cause is
the embedded pair's first use (a 93 MB download and a conversion, logged with the cache's path) inside a kernel.
"""

import re

MACHINE_TEXT = re.compile(
    r"/root/|/home/|/work/|/tmp/|/Users/|[A-Z]:\\|site-packages|\.cache/"  # a path of the machine that ran it
    r"|Looking in (indexes|links)|Collecting \S|Downloading \S|Successfully installed|Requirement already"  # pip
    r"|\[specdec_edu\] (first use|downloading)"  # the embedded pair built inside the kernel
)


def _text(output) -> str:
    """The text a reader sees of one output: a stream, a plain-text result, a traceback."""
    text = output.get("text", "")
    text = "".join(text) if isinstance(text, list) else text
    plain = output.get("data", {}).get("text/plain", "")
    plain = "".join(plain) if isinstance(plain, list) else plain
    return "\n".join([text, plain, *output.get("traceback", [])])


def machine_text(nb) -> list[str]:
    """``"cell N: <line>"`` for each output line of ``nb`` (a notebook dict) that holds an install log or a machine
    path; N counts every cell from 0."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            for line in _text(output).splitlines():
                if MACHINE_TEXT.search(line):
                    found.append(f"cell {i}: {line.strip()[:160]}")
    return found
