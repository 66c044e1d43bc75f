"""The llama.cpp engine: a real small model on the CPU (``engine.py``) and its HTTP server run
as a process (``server.py``).
"""
