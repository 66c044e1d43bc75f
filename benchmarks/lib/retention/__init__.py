"""The retention benchmark's pieces: its sampling of the database, its figures, its run and
how it shows them."""
