"""Recall's portable steps: fusion, ranking, dates, name sub-queries, touches."""
