"""Celery app, worker bootstrap (one backend per worker process) and the session tasks."""
