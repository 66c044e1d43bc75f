"""A worker's row in ``workers``: what it reports (``report``) and its SQL (``repository``)."""
