"""``speclane demo``: a laptop-sized end-to-end run of the gateway against simulated vLLM pools.

``stack`` starts and stops the processes, ``policy`` writes the demo policy, ``workload``
builds the six request kinds, ``driver`` sends them and records what each one saw, ``live``
draws the progress display, ``replay`` re-runs the recorded trace in virtual time,
``summary`` and ``report`` turn it all into tables and JSON; ``cli`` holds the options and
``session`` runs one demo from start to finish.
"""
