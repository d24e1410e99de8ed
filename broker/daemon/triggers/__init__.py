"""Triggers: jobs the daemon submits on a schedule, when data arrives, or when asked (`triggers.yaml`).

`model` is the file, `sources` counts new data, `records` keeps fires and baselines in `state.db`, `engine`
decides and fires, `submitting` connects the engine to the broker.
"""
