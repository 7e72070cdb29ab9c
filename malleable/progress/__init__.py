"""The job contract's data path: progress files from jobs to the database.

Owns the job-side reporter (``reporter.py``, standard library only, so it
imports inside any training environment), the progress-line format and its
validation, and the daemon-side ingestion of the spool directory: new bytes
only, offsets kept in the database, safe file opening, and a counted reason for
every rejected line.
"""
