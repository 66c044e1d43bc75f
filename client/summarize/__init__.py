"""``sluicegate summarize``: documents read from disk, batch requests built from them, the run
and its progress.
"""
