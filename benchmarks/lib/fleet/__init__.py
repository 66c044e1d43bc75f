"""The fleet benchmark's pieces: its schedule, its simulated workers, their sampling, one
run under a pull policy, and the figures."""
