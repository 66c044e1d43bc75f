"""Uploaded files (OpenAI's Files API): their checks and their SQL."""
