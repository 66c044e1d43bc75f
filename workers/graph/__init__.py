"""A document too long for its pool's engine, summarized as a graph of jobs: its chunks
(the map) and the reduces of their summaries, level by level, until one summary is left.

``plan`` cuts the document (pure), ``splitter`` measures it with the engine's own
tokenizer, ``repository`` writes the graph and the step each part's end triggers,
``part_store`` a part's end with its count, ``ids`` draws the parts' ids."""
