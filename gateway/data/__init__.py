"""Stored data as a whole: the retention purge (:mod:`.retention`) and one principal's data
(:mod:`.principal`). Project level: it reads and deletes across the apps' tables."""
