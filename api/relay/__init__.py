"""One submitted task's event stream, watched (start deadline, lease, worker, replay), and
another slot for it when its worker is gone.

Shared by every endpoint that runs work; it imports only ``api.gateway``, never an endpoint.
"""
