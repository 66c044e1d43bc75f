"""Admission: the controller (block, reject, deadline-aware), rate limits, size limits and
Little's law.
"""
