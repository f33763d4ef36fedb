"""Downloads and their cache: the fetch with its checks and progress
(:mod:`.fetch`), the cache's folder, locks and errors (:mod:`.cache`) and
HTTP with its deadlines and resumption (:mod:`.http`)."""
