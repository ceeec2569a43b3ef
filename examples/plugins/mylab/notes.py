# examples/plugins/mylab/notes.py
"""[run_notes]: a run's title and tags, for its trackers — a config section of one's own, in one file.

Installed (``pip install ./examples/plugins``: the entry point ``run_notes = "mylab.notes"`` of the group
``phalanx.sections``), a config may write::

    [run_notes]
    title = "cwtm under ALIE, 10 % Byzantine"
    tags = ["baseline", "alie"]

(or the flat ``title = …``); ``phalanx list sections`` lists it, a value is checked by the declaration below
(``title`` of more than 200 characters: ``[run_notes].title=… is invalid: allowed at most 200 characters``), and
every tracker receives it with the run's config (``run.params["title"]``). The section is result-neutral: its keys
change no result and never enter a run's id.
"""

from phalanx.experiments.declare import Key, Section
from phalanx.experiments.section_registry import register

RUN_NOTES = register(Section("run_notes", (
    Key("title", "title", str, "", "the run's title, shown by its trackers", max_len=200),
    Key("tags", "tags", list[str], [], "the run's tags, shown by its trackers", max_len=32),
), "notes on a run, read by its trackers", result_neutral=True))
