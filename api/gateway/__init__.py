"""The gateway process: the state every connection shares (``state.Gateway``) and the
services it runs for them: the queue of waiting clients, the batched liveness reads, the watch
on clients that stopped keeping up, the stops it owes workers, task submission.

Below every endpoint: it imports only ``api.metrics`` and ``api.recordings``.
"""
