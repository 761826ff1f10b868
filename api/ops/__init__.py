"""What an operator sees and reads: health and readiness, the worker registry and the metrics
exposition, the access log, the gateway's own pages (the browser client and ``/ops``).
"""
